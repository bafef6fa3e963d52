package errtext

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncateNeverSplitsARune(t *testing.T) {
	s := strings.Repeat("é", 10) // 2 bytes each
	for n := range 22 {
		got := Truncate(s, n)
		if len(got) > n || !utf8.ValidString(got) || len(got) < n-1 {
			t.Fatalf("Truncate(%d) = %q (%d bytes)", n, got, len(got))
		}
	}
	if got := Truncate("a\xffb", 10); got != "ab" {
		t.Fatalf("invalid bytes kept: %q", got)
	}
}

func TestOf(t *testing.T) {
	if Of(nil) != "" {
		t.Fatal("nil error has text")
	}
	if got := Of(errors.New(strings.Repeat("x", MaxLen+10))); len(got) != MaxLen {
		t.Fatalf("len = %d, want %d", len(got), MaxLen)
	}
}

package request_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/request"
)

func TestKeyRules(t *testing.T) {
	for _, tc := range []struct {
		rules request.KeyRules
		key   string
		ok    bool
	}{
		{request.KeyRules{}, "abc", true},
		{request.KeyRules{}, "with space and \"quotes\"", true},
		{request.KeyRules{}, strings.Repeat("k", 255), true},
		{request.KeyRules{}, strings.Repeat("k", 256), false},
		{request.KeyRules{MaxLen: 10}, strings.Repeat("k", 11), false},
		{request.KeyRules{}, "", false},
		{request.KeyRules{}, "nul\x00", false},
		{request.KeyRules{}, "del\x7f", false},
		{request.KeyRules{Format: request.UUIDKey}, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{request.KeyRules{Format: request.UUIDKey}, "8E03978E-40D5-43E8-BC93-6894A57F9324", true},
		{request.KeyRules{Format: request.UUIDKey}, "8e03978e40d543e8bc936894a57f9324", false},
		{request.KeyRules{Format: request.UUIDKey}, "{8e03978e-40d5-43e8-bc93-6894a57f9324}", false},
		{request.KeyRules{Format: request.ULIDKey}, "01ARZ3NDEKTSV4RRFFQ69G5FAV", true},
		{request.KeyRules{Format: request.ULIDKey}, "01arz3ndektsv4rrffq69g5fav", true},
		{request.KeyRules{Format: request.ULIDKey}, "81ARZ3NDEKTSV4RRFFQ69G5FAV", false}, // over 128 bits
		{request.KeyRules{Format: request.ULIDKey}, "01ARZ3NDEKTSV4RRFFQ69G5FAU", false}, // U is not Crockford
		{request.KeyRules{Format: request.ULIDKey}, "01ARZ3NDEKTSV4RRFFQ69G5FA", false},
	} {
		err := tc.rules.Check(request.ID{Key: tc.key})
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, request.ErrInvalidKey)) {
			t.Errorf("%+v.Check(%q) = %v, want ok=%v", tc.rules, tc.key, err, tc.ok)
		}
	}
}

func TestFingerprintSeparatesParts(t *testing.T) {
	a := request.Fingerprint([]byte("ab"), []byte("c"))
	b := request.Fingerprint([]byte("a"), []byte("bc"))
	if string(a) == string(b) || len(a) != 32 {
		t.Fatalf("fingerprints %x and %x", a, b)
	}
}

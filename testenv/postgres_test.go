package testenv

import (
	"context"
	"testing"
)

func TestPostgresGivesEachTestItsOwnDatabase(t *testing.T) {
	a, b := Postgres(t), Postgres(t)
	var nameA, nameB string
	if err := a.QueryRow(context.Background(), "SELECT current_database()").Scan(&nameA); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(context.Background(), "SELECT current_database()").Scan(&nameB); err != nil {
		t.Fatal(err)
	}
	if nameA == nameB {
		t.Fatalf("two calls share database %s", nameA)
	}
}

func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u@h:5432/postgres?sslmode=disable": "postgres://u@h:5432/x?sslmode=disable",
		"host=h user=u": "host=h user=u dbname=x",
	} {
		if got := withDatabase(in, "x"); got != want {
			t.Errorf("withDatabase(%q) = %q, want %q", in, got, want)
		}
	}
}

package pgutil

import (
	"testing"
	"testing/fstest"
)

func TestExpandQuotesPlaceholders(t *testing.T) {
	table, err := NewTable("app", "my_inbox")
	if err != nil {
		t.Fatal(err)
	}
	got := expand(`CREATE TABLE {{table}} (); CREATE TABLE {{table_scopes}} (); CREATE SCHEMA {{schema}}; SELECT '{{other}}'`, table)
	want := `CREATE TABLE "app"."my_inbox" (); CREATE TABLE "app"."my_inbox_scopes" (); CREATE SCHEMA "app"; SELECT '{{other}}'`
	if got != want {
		t.Fatalf("expand =\n%s\nwant\n%s", got, want)
	}
}

func TestReadMigrationsOrdersByVersionAndRejectsBadNames(t *testing.T) {
	files := fstest.MapFS{
		"m/0002_b.sql": {Data: []byte("b")},
		"m/0010_c.sql": {Data: []byte("c")},
		"m/0001_a.sql": {Data: []byte("a")},
	}
	ms, err := readMigrations(files, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 || ms[0].version != 1 || ms[1].version != 2 || ms[2].version != 10 {
		t.Fatalf("migrations out of order: %+v", ms)
	}
	files["m/notes.txt"] = &fstest.MapFile{Data: []byte("x")}
	if _, err := readMigrations(files, "m"); err == nil {
		t.Fatal("a file not named NNNN_name.sql was accepted")
	}
}

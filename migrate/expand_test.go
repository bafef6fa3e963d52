package migrate

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/idemq/idemq/internal/pgutil"
)

func TestExpandQuotesPlaceholders(t *testing.T) {
	table, err := pgutil.NewTable("app", "my_inbox")
	if err != nil {
		t.Fatal(err)
	}
	got := expand(`CREATE TABLE {{table}} (); CREATE TABLE {{table_scopes}} (); CREATE SCHEMA {{schema}}; DROP INDEX {{table_key_seq_idx}}; SELECT '{{other}}'`, table)
	want := `CREATE TABLE "app"."my_inbox" (); CREATE TABLE "app"."my_inbox_scopes" (); CREATE SCHEMA "app"; DROP INDEX "app"."my_inbox_key_seq_idx"; SELECT '{{other}}'`
	if got != want {
		t.Fatalf("expand =\n%s\nwant\n%s", got, want)
	}
}

// TestIndexNameShortensLikePostgres: the names Postgres 15 gave unnamed
// indexes on a 48-byte table (checked on a server); the database tests
// (TestDownAndUpAgainKeepRows) prove the rule on every index the down
// migrations drop.
func TestIndexNameShortensLikePostgres(t *testing.T) {
	long := strings.Repeat("t", 48)
	for _, c := range []struct{ table, columns, want string }{
		{"idemq_inbox", "scope_id_updated_at", "idemq_inbox_scope_id_updated_at_idx"},
		{long, "key_seq", strings.Repeat("t", 48) + "_key_seq_idx"},
		{long, "scope_id_updated_at", strings.Repeat("t", 39) + "_scope_id_updated_at_idx"},
		{long, "coalesce_seq", strings.Repeat("t", 46) + "_coalesce_seq_idx"},
	} {
		if got := indexName(c.table, c.columns); got != c.want || len(got) > 63 {
			t.Errorf("indexName(%d bytes, %q) = %q, want %q", len(c.table), c.columns, got, c.want)
		}
	}
}

func TestReadOrdersByVersionAndRejectsBadFiles(t *testing.T) {
	files := fstest.MapFS{
		"m/0002_b.up.sql":   {Data: []byte("b")},
		"m/0002_b.down.sql": {Data: []byte("-b")},
		"m/0001_a.up.sql":   {Data: []byte("a")},
		"m/0001_a.down.sql": {Data: []byte("-a")},
	}
	src := Source{Component: "inbox", Schema: "public", Table: "t", Files: files, Dir: "m"}
	s, err := read(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.steps) != 2 || s.steps[0].name != "a" || s.steps[1].up != "b" || s.steps[1].down != "-b" {
		t.Fatalf("steps out of order: %+v", s.steps)
	}
	for file, why := range map[string]string{
		"m/notes.txt":       "a file not named NNNN_name.up.sql",
		"m/0003_c.up.sql":   "an up without its down",
		"m/0002_x.down.sql": "a version with two names",
	} {
		files[file] = &fstest.MapFile{Data: []byte("x")}
		if _, err := read(src); err == nil {
			t.Errorf("%s was accepted", why)
		}
		delete(files, file)
	}
}

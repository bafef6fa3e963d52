package testenv

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestPrivatePostgresRunsWithItsSettingsAndIsRemovedAtStop(t *testing.T) {
	s := PrivatePostgres(t, "max_prepared_transactions=10")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	var prepared, user string
	if err := conn.QueryRow(ctx, "SELECT current_setting('max_prepared_transactions'), current_user").Scan(&prepared, &user); err != nil {
		t.Fatal(err)
	}
	if prepared != "10" || user != "postgres" {
		t.Fatalf("max_prepared_transactions = %s, current_user = %s; want 10, postgres", prepared, user)
	}
	// A prepared transaction works only with the setting applied.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "CREATE TABLE t (id int); PREPARE TRANSACTION 'p1'"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "COMMIT PREPARED 'p1'"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s still there after Stop: %v", s.dir, err)
	}
	if _, err := pgx.Connect(ctx, s.URL()); err == nil {
		t.Error("the server still answers after Stop")
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestStartPostgresRefusesASettingWithoutValue(t *testing.T) {
	if _, err := StartPostgres(context.Background(), "fsync"); err == nil || !strings.Contains(err.Error(), "name=value") {
		t.Fatalf("StartPostgres(fsync) = %v, want an error asking for name=value", err)
	}
}

func TestPostgresBinariesMissingSaysWhatToInstall(t *testing.T) {
	_, err := postgresBinDir([]string{t.TempDir()})
	if !errors.Is(err, ErrNoPostgresBinaries) || !strings.Contains(err.Error(), "apt-get install postgresql") {
		t.Fatalf("postgresBinDir(empty dir) = %v, want ErrNoPostgresBinaries saying what to install", err)
	}
	if dir, err := postgresBinDir(postgresBinDirs()); err != nil {
		t.Fatalf("this machine's Postgres server binaries: %v", err)
	} else if !isExecutable(dir + "/postgres") {
		t.Fatalf("postgresBinDir = %s, which has no postgres", dir)
	}
}

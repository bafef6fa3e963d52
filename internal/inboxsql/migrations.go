package inboxsql

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"strings"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

//go:embed partitioned/*.sql
var partitionedMigrations embed.FS

// migrationFiles is the migrations directory, with the partitioned mode's
// own migration on top when the Store is partitioned: a partitioned inbox
// is one version ahead, and Down to the version before undoes it.
func (s *Store) migrationFiles() fs.FS {
	if s.cfg.Partitioning == Unpartitioned {
		return migrations
	}
	return overlay{migrations, partitionedMigrations}
}

// overlay reads "migrations" from a, adding b's "partitioned" files.
type overlay struct{ a, b embed.FS }

func (o overlay) Open(name string) (fs.File, error) {
	if f, err := o.a.Open(name); err == nil || name == "migrations" {
		return f, err
	}
	return o.b.Open(strings.Replace(name, "migrations/", "partitioned/", 1))
}

func (o overlay) ReadDir(name string) ([]fs.DirEntry, error) {
	ea, err := o.a.ReadDir(name)
	if err != nil {
		return nil, err
	}
	eb, err := o.b.ReadDir("partitioned")
	if err != nil {
		return nil, err
	}
	return append(ea, eb...), nil
}

// MigrationSource implements [migrate.Store]: the inbox tables'
// migrations, under the component name "inbox".
func (s *Store) MigrationSource() migrate.Source {
	return migrate.Source{Component: "inbox", Schema: s.cfg.Schema, Table: s.cfg.Table, Files: s.migrationFiles(), Dir: "migrations"}
}

// Migrate creates or upgrades the inbox tables on the Store's handle,
// creates the partitions due, and checks that the table's layout is the
// Config's. It is idempotent and safe to run from several processes at
// once.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := migrate.New(s.db, s).Migrate(ctx); err != nil {
		return err
	}
	return s.EnsurePartitions(ctx)
}

// PendingMigrations returns the migrations Migrate would apply, in order;
// none once the tables are up to date.
func (s *Store) PendingMigrations(ctx context.Context) ([]migrate.Migration, error) {
	return migrate.New(s.db, s).Pending(ctx)
}

// checkLayout refuses a table partitioned differently from the Config
// (an *idemq.ConfigError on Partitioning): a plain Config's statements
// would fail on every claim of a partitioned table, and a partitioned
// Config's on a plain one. It checks once per Store.
func (s *Store) checkLayout(ctx context.Context) error {
	s.mu.RLock()
	ok := s.layoutOK
	s.mu.RUnlock()
	if ok {
		return nil
	}
	var partitioned *bool
	err := s.db.QueryRow(ctx, `SELECT (SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1))`, s.table.String()).Scan(&partitioned)
	if err != nil {
		return fmt.Errorf("inbox: read the table's layout: %w", err)
	}
	switch {
	case partitioned == nil:
		return fmt.Errorf("%w: table %s does not exist", ErrNotMigrated, s.table)
	case *partitioned && s.cfg.Partitioning == Unpartitioned:
		return idemq.NewConfigError("inbox", "Partitioning", "is Unpartitioned but table %s is partitioned: open it with the Config it was migrated with (Partitioning, PartitionInterval)", s.table)
	case !*partitioned && s.cfg.Partitioning != Unpartitioned:
		return idemq.NewConfigError("inbox", "Partitioning", "is %s but table %s is not partitioned: run Migrate (idemq migrate --inbox-partitioned) with this Config first", s.cfg.Partitioning, s.table)
	}
	s.mu.Lock()
	s.layoutOK = true
	s.mu.Unlock()
	return nil
}

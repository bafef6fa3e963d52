package migrate

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/idemq/idemq"
)

// Format is a layout of migration files that [Migrator.Export] writes.
type Format string

// The formats of [Migrator.Export]; the zero Format is GolangMigrate.
const (
	// GolangMigrate writes NNNN_table_name.up.sql and
	// NNNN_table_name.down.sql, the layout of golang-migrate, which Atlas
	// reads too (its golang-migrate directory format).
	GolangMigrate Format = "golang-migrate"
	// Goose writes one NNNN_table_name.sql per migration, its up and down
	// under goose's "-- +goose Up" and "-- +goose Down" lines.
	Goose Format = "goose"
	// Flyway writes VNNNN__table_name.sql and, for undo (Flyway Teams),
	// UNNNN__table_name.sql.
	Flyway Format = "flyway"
)

// file is one file to export.
type file struct{ name, sql string }

func (f Format) validate() error {
	switch f {
	case "", GolangMigrate, Goose, Flyway:
		return nil
	}
	return idemq.NewConfigError("migrate", "Format", "%q: want %s, %s or %s", f, GolangMigrate, Goose, Flyway)
}

// files lays out migration number n, called base, as f's files.
func (f Format) files(n int, base, mark, up, down string) []file {
	upMark, downMark := exportMark+mark+" up\n", exportMark+mark+" down\n"
	switch f {
	case Goose:
		return []file{{fmt.Sprintf("%04d_%s.sql", n, base), upMark + "-- +goose Up\n" + up + "\n-- +goose Down\n" + down}}
	case Flyway:
		return []file{{fmt.Sprintf("V%04d__%s.sql", n, base), upMark + up}, {fmt.Sprintf("U%04d__%s.sql", n, base), downMark + down}}
	}
	return []file{{fmt.Sprintf("%04d_%s.up.sql", n, base), upMark + up}, {fmt.Sprintf("%04d_%s.down.sql", n, base), downMark + down}}
}

// exportMark begins the first line of every exported file; the rest of the
// line says which migration the file holds, so that a later Export into
// the same directory knows what is there.
const exportMark = "-- idemq migration "

// Export writes the migrations of the stores into dir as plain SQL files
// in format, for golang-migrate, goose, Atlas, Flyway or psql, numbered
// from 0001 in the order Migrate applies them, with the schema and table
// names filled in. It returns the names of the files written. Export
// touches no database.
//
// Each up also creates the schema and the migration log if needed and
// records itself there, and takes the lock Migrate takes; each down
// removes its record. So a database migrated from the files is one that
// Migrate, Validate and the idemq binary see as migrated, and either way of
// migrating can take over from the other.
//
// Exporting again into the same directory (after upgrading idemq) keeps
// the files there and adds only the migrations it lacks, numbered after
// the highest number present: tools that apply files in order never see a
// new file numbered below one they already applied.
func (m *Migrator) Export(dir string, format Format) ([]string, error) {
	if m.err != nil {
		return nil, m.err
	}
	if err := format.validate(); err != nil {
		return nil, err
	}
	done, last, err := exported(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("idemq: export migrations: %w", err)
	}
	lock := lockSQL + "; -- the lock of idemq's own migrator: one of the two waits for the other\n"
	written := []string{}
	for _, s := range m.stores {
		for _, st := range s.steps {
			mark := fmt.Sprintf("%s %d", s.owner(), st.version)
			if done[mark] {
				continue
			}
			last++
			mg := s.migration(st)
			up := lock + strings.Join(s.prologue(), ";\n") + ";\n\n" + mg.Up + "\n" +
				fmt.Sprintf("INSERT INTO %s (owner, version, name) VALUES ('%s', %d, '%s');\n", s.log(), s.owner(), st.version, st.name)
			down := lock + "\n" + mg.Down + "\n" +
				fmt.Sprintf("DELETE FROM %s WHERE owner = '%s' AND version = %d;\n", s.log(), s.owner(), st.version)
			for _, f := range format.files(last, s.table.Name+"_"+st.name, mark, up, down) {
				if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.sql), 0o644); err != nil {
					return nil, fmt.Errorf("idemq: export migrations: %w", err)
				}
				written = append(written, f.name)
			}
		}
	}
	return written, nil
}

// exported returns the migrations exported into dir before, by their mark
// ("owner version"), and the highest file number there.
func exported(dir string) (done map[string]bool, last int, err error) {
	done = map[string]bool{}
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil {
		return nil, 0, err
	}
	for _, name := range files {
		number, _, _ := strings.Cut(strings.TrimLeft(filepath.Base(name), "VU"), "_")
		n, err := strconv.Atoi(number)
		if err != nil {
			return nil, 0, fmt.Errorf("idemq: export migrations: %s in %s is not numbered: export into a directory of its own", filepath.Base(name), dir)
		}
		last = max(last, n)
		f, err := os.Open(name)
		if err != nil {
			return nil, 0, fmt.Errorf("idemq: export migrations: %w", err)
		}
		line, _ := bufio.NewReader(f).ReadString('\n')
		f.Close()
		if mark, ok := strings.CutSuffix(strings.TrimPrefix(line, exportMark), " up\n"); ok && strings.HasPrefix(line, exportMark) {
			done[mark] = true
		}
	}
	return done, last, nil
}

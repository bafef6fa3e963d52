package migrate

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// exportMark begins the first line of every exported file; the rest of the
// line says which migration the file holds, so that a later Export into
// the same directory knows what is there.
const exportMark = "-- idemq migration "

// Export writes the migrations of the stores into dir as plain SQL files
// for golang-migrate, goose, Atlas, Flyway or psql: NNNN_table_name.up.sql
// and NNNN_table_name.down.sql, numbered from 0001 in the order Migrate
// applies them, with the schema and table names filled in. It returns the
// names of the files written. Export touches no database.
//
// Each up file also creates the schema and the migration log if needed and
// records itself there, and takes the lock Migrate takes; each down file
// removes its record. So a database migrated from the files is one that
// Migrate, Validate and the idemq binary see as migrated, and either way
// of migrating can take over from the other.
//
// Exporting again into the same directory (after upgrading idemq) keeps
// the files there and adds only the migrations it lacks, numbered after
// the highest number present: tools that apply files in order never see a
// new file numbered below one they already applied.
func (m *Migrator) Export(dir string) ([]string, error) {
	if m.err != nil {
		return nil, m.err
	}
	done, last, err := exported(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("idemq: export migrations: %w", err)
	}
	written := []string{}
	for _, s := range m.stores {
		for _, st := range s.steps {
			mark := fmt.Sprintf("%s %d", s.owner(), st.version)
			if done[mark] {
				continue
			}
			last++
			mg := s.migration(st)
			lock := lockSQL + "; -- the lock of idemq's own migrator: one of the two waits for the other\n"
			var up strings.Builder
			up.WriteString(exportMark + mark + " up\n" + lock)
			for _, stmt := range s.prologue() {
				up.WriteString(stmt + ";\n")
			}
			up.WriteString("\n" + mg.Up + "\n")
			fmt.Fprintf(&up, "INSERT INTO %s (owner, version, name) VALUES ('%s', %d, '%s');\n", s.log(), s.owner(), st.version, st.name)
			down := exportMark + mark + " down\n" + lock + "\n" + mg.Down + "\n" +
				fmt.Sprintf("DELETE FROM %s WHERE owner = '%s' AND version = %d;\n", s.log(), s.owner(), st.version)
			base := fmt.Sprintf("%04d_%s_%s", last, s.table.Name, st.name)
			for _, f := range []struct{ name, sql string }{{base + ".up.sql", up.String()}, {base + ".down.sql", down}} {
				if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.sql), 0o644); err != nil {
					return nil, fmt.Errorf("idemq: export migrations: %w", err)
				}
				written = append(written, f.name)
			}
		}
	}
	return written, nil
}

// exported returns the migrations exported into dir before, by their
// mark ("owner version"), and the highest file number there.
func exported(dir string) (done map[string]bool, last int, err error) {
	done = map[string]bool{}
	files, err := filepath.Glob(filepath.Join(dir, "*.up.sql"))
	if err != nil {
		return nil, 0, err
	}
	for _, name := range files {
		number, _, _ := strings.Cut(filepath.Base(name), "_")
		n, err := strconv.Atoi(number)
		if err != nil {
			return nil, 0, fmt.Errorf("idemq: export migrations: %s in %s is not numbered NNNN_: export into a directory of its own", filepath.Base(name), dir)
		}
		last = max(last, n)
		f, err := os.Open(name)
		if err != nil {
			return nil, 0, fmt.Errorf("idemq: export migrations: %w", err)
		}
		line, _ := bufio.NewReader(f).ReadString('\n')
		f.Close()
		if mark, ok := strings.CutPrefix(line, exportMark); ok {
			done[strings.TrimSuffix(mark, " up\n")] = true
		}
	}
	return done, last, nil
}

package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Lookup returns the records of key in every scope, most recently updated
// first: what happened to a message (or, in a request store's inbox, a
// request) of that key, whichever consumer applied it. It probes the
// primary key once per scope. None is an empty slice, not an error.
func (s *Store) Lookup(ctx context.Context, key string) ([]Record, error) {
	if key == "" {
		return nil, fmt.Errorf("inbox: lookup: empty key")
	}
	id, _ := keyID(key)
	rows, err := s.db.Query(ctx, s.sql.lookup, id)
	if err != nil {
		return nil, fmt.Errorf("inbox: lookup %q: %w", key, notMigrated(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var scope, class string
		var rec storedRecord
		if err := row.Scan(append([]any{&scope, &class}, rec.dest()...)...); err != nil {
			return Record{}, err
		}
		r := rec.record(scope, key)
		r.ErrorClass = class
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: lookup %q: %w", key, notMigrated(err))
	}
	return out, nil
}

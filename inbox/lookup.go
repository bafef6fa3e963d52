package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/inboxsql"
)

// Lookup returns the records of key in every scope, most recently updated
// first: what happened to a message (or, in a request store's inbox, a
// request) of that key, whichever consumer applied it. It probes the
// primary key once per scope. None is an empty slice, not an error.
func (s *Store) Lookup(ctx context.Context, key string) ([]Record, error) {
	if key == "" {
		return nil, fmt.Errorf("inbox: lookup: empty key")
	}
	id, _ := inboxsql.KeyID(key)
	rows, err := s.db.Query(ctx, s.sql.lookup, id)
	if err != nil {
		return nil, fmt.Errorf("inbox: lookup %q: %w", key, inboxsql.NotMigrated(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var scope, class string
		var rec inboxsql.Scan
		if err := row.Scan(append([]any{&scope, &class}, rec.Dest()...)...); err != nil {
			return Record{}, err
		}
		r := Record(rec.Row(scope, key))
		r.ErrorClass = class
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: lookup %q: %w", key, inboxsql.NotMigrated(err))
	}
	return out, nil
}

package outbox

import (
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/pgutil"
)

// Chores returns the outbox's maintenance, for an [idemq.Maintenance]:
// [Outbox.ClassifyDead] every minute, in one process at a time however
// many run it. (The relay vacuums its own table.)
func (o *Outbox) Chores() []idemq.Chore {
	return []idemq.Chore{pgutil.Chore(o.db, "outbox classify "+o.table.String(), time.Minute, pgutil.UntilDone(o.ClassifyDead))}
}

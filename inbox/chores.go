package inbox

import (
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/pgutil"
)

// Chores returns the inbox's maintenance, for an [idemq.Maintenance]:
// GC (on a partitioned inbox, dropping expired partitions and creating
// those due) every minute, and on a partitioned inbox at least four times
// per PartitionInterval; and [Store.ClassifyDead] every minute. Each
// chore runs in one process at a time however many run it.
func (s *Store) Chores() []idemq.Chore {
	core := s.core()
	return []idemq.Chore{
		core.GCChore("inbox"),
		pgutil.Chore(core.DB(), "inbox classify "+core.Table().String(), time.Minute, pgutil.UntilDone(s.ClassifyDead)),
	}
}

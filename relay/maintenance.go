package relay

import "github.com/idemq/idemq"

// Maintenance returns the service that keeps the relay's outbox in
// shape, its [outbox.Outbox.Chores] (dead-letter classification), with
// the extra chores of other stores on the same database
// (inbox.Store.Chores, pgstore.Store.Chores), logged through the relay's
// logger. Start it with idemq.Start beside the relay, in every process
// that runs one: each chore runs in one process at a time. The relay's
// own VACUUM of the outbox stays in Run.
func (r *Relay) Maintenance(extra ...idemq.Chore) (*idemq.Maintenance, error) {
	return idemq.NewMaintenance(r.log, append(r.ob.Chores(), extra...)...)
}

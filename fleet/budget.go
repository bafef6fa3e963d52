package fleet

import (
	"fmt"
	"sync"

	"github.com/idemq/idemq"
)

// Budget caps the connections one process holds on each server, all its
// databases together: max_connections is per server, so a thousand
// tenant databases on one server share it. Each user reserves the
// connections a pool may open before it opens it, and gives them back
// after closing it.
type Budget struct {
	perServer int
	mu        sync.Mutex
	used      map[string]int
}

// NewBudget returns a budget of perServer connections on every server.
func NewBudget(perServer int) (*Budget, error) {
	if perServer < 1 {
		return nil, idemq.NewConfigError("fleet", "budget", "%d connections per server; want at least 1", perServer)
	}
	return &Budget{perServer: perServer, used: map[string]int{}}, nil
}

// PerServer returns the budget of each server.
func (b *Budget) PerServer() int { return b.perServer }

// TryReserve reserves n connections on server and reports whether they
// fit in its budget; nothing is reserved when they do not.
func (b *Budget) TryReserve(server string, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used[server]+n > b.perServer {
		return false
	}
	b.used[server] += n
	return true
}

// Release gives back n connections reserved on server.
func (b *Budget) Release(server string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used[server] < n {
		panic(fmt.Sprintf("fleet: released %d connections on %s, %d reserved", n, server, b.used[server]))
	}
	b.used[server] -= n
	if b.used[server] == 0 {
		delete(b.used, server)
	}
}

// InUse returns the connections reserved on server.
func (b *Budget) InUse(server string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used[server]
}

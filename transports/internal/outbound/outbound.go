// Package outbound holds what the Kafka sinks do alike with an outbox
// message on its way out.
package outbound

import (
	"maps"
	"slices"

	"github.com/idemq/idemq/relay"
)

// Headers calls add for every header of m's record: m's headers in name
// order, leaving out idHeader, then idHeader with m's id (an outbox header
// of that name is overwritten).
func Headers(m *relay.Message, idHeader string, add func(name string, value []byte)) {
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		if k != idHeader {
			add(k, []byte(m.Headers[k]))
		}
	}
	add(idHeader, []byte(m.ID.String()))
}

package outbox

import (
	"context"
	"maps"
)

// withHeaders adds the headers enrich writes for ctx (Config.Headers: the
// trace context, say) to each message. A message that already carries a
// header of the same name keeps its own: a creation context set by the
// caller is not replaced. The caller's messages and header maps are not
// modified; msgs is returned unchanged when enrich is nil or adds nothing.
func withHeaders(ctx context.Context, enrich func(context.Context, map[string]string), msgs []Message) []Message {
	if enrich == nil {
		return msgs
	}
	added := map[string]string{}
	enrich(ctx, added)
	if len(added) == 0 {
		return msgs
	}
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		h := make(map[string]string, len(m.Headers)+len(added))
		maps.Copy(h, added)
		maps.Copy(h, m.Headers)
		m.Headers = h
		out[i] = m
	}
	return out
}

// Package console is idemq's operator console: an [http.Handler] a service
// mounts (or `idemq ui` serves) that shows the outbox's backlog and the
// relays draining it, dead letters grouped by cause, the inbox's dead
// letters, conflicts and expired leases (inbox.Store.ExpiredLeases: claims
// whose holder died in progress, counted up to a cap per scope from a
// partial index of in-progress records), webhook endpoints, one idempotency key's story,
// and the audit log, and lets an authenticated operator act on them.
//
// Pages are rendered on the server from html/template with their style
// sheet embedded (go:embed): nothing to build or install beside the
// binary. Every page reads index edges or bounded index ranges (see
// outbox.Outbox.Gauges and outbox.Outbox.DeadGroups), never count(*) over
// the outbox.
//
// The webhook page shows what the endpoint registry stores: failing since,
// disabled and why, and the breaker state (open, half-open, closed) with
// since when and which relay reported it. Each relay's webhook Sink keeps
// its own breaker per endpoint and records every change of its state on
// the endpoint's row, so with several relays the last report wins (see
// package transports/webhook). An endpoint whose breaker is open or
// half-open is listed with the failing ones.
//
// # Rates
//
// The outbox keeps no durable count of what the relays published (a
// published row is deleted), so the overview's rates come from two
// observations of the gauges this console instance read, kept in memory
// for five minutes: enqueued per minute is the movement of the seq
// sequence (outbox.Gauges.Enqueued), drained per minute is that minus the
// depth's growth (published plus dead-lettered; an estimate when the
// depths are), and per destination the depth's change per minute. Dead
// letters per minute, per destination, are counted over the last five
// minutes from the dead-letter table, which is durable. Rates show "-"
// until a second look, and restart with the process.
//
// # Safety
//
// The console is read-only unless [Config.AllowActions] is set, and even
// then every action (replay a group, one message or everything failed
// since a time, purge a group or one message, release or purge inbox dead
// letters, enable a webhook endpoint) needs an authenticated user: a
// bearer token ([Config.Token], [Config.Tokens], in an Authorization
// header or through the login page's cookie) or basic auth ([Config.User]
// and [Config.Password]). When either is configured, every page needs it
// too. Every POST is checked twice against cross-site request forgery:
// net/http's CrossOriginProtection (Sec-Fetch-Site and Origin) and a
// per-user token in the form.
//
// An action that replays, releases or purges takes two steps: the first
// answers a page that says what it will do, to how many rows, with which
// filter; the second, with that page's signed token, acts on the rows that
// had failed when the page counted them, never on rows that failed since.
// An empty or blank form field is refused, never read as "all"; "replay
// everything since" names a destination or says all destinations
// explicitly. What an action did reaches the next page in a signed cookie,
// never in the URL.
//
// Every action a user confirmed, and every one that matched nothing, is
// written to the outbox's audit log (outbox migrations 0004 and 0005): who
// ("ui:" and the basic-auth user or the token's name), what, the target,
// the filter, the rows and the outcome (done, nothing to do, failed), in
// the transaction that acts, and shown on the Audit page. Replays keep
// each message's id, so a replay done twice is absorbed by the receiving
// inbox.
//
// Pages answer bad input (a NUL byte or invalid UTF-8 in a parameter, a
// blank filter, a time that does not parse) with a 400 page, and a
// database whose idemq tables are missing with a page that names the
// missing table and the idemq migrate command that creates it.
package console

// Package transporttest is the transport conformance suite: the crash and
// duplicate scenarios every idemq transport must pass, written once and run
// by each transport's tests in a few lines, after Watermill's
// pubsub/tests.
//
// A transport implements [Harness] (publish raw messages with or without an
// id, subscribe a consumer.Consumer, kill a subscription between the
// database commit and the ack, hand out its relay sink) and declares its
// guarantees in [Features]; [Run] then checks, on real brokers and a real
// Postgres database per scenario, that:
//
//   - PublisherDuplicates: a producer sending every message twice and some
//     five times gets each applied once;
//   - MissingID: messages without an id get the transport's fallback id and
//     are applied once each (refused, never applied, with
//     Features.RequiresID);
//   - CrashBetweenCommitAndAck: a subscription killed after its
//     transaction committed and before the ack is restarted, the redelivery
//     is recognised as a duplicate, every message is applied once and none
//     is lost (Features.Redelivery);
//   - RacingSubscriptions: two subscriptions that both receive every message
//     race on one inbox scope; each message is applied once;
//   - GroupMemberLeaves: one of two members of a group leaves mid-stream,
//     the other takes over; each message is applied once
//     (Features.SharedGroup);
//   - MalformedID: messages with an oversized or non-UTF-8 id never stall
//     the stream (dead-lettered or applied under a fallback id, at most
//     once);
//   - PoisonMessage: a permanently failing message is dead-lettered (and
//     published to the dead-letter destination with
//     Features.DeadLetterDestination), the stream moves on, a flaky one is
//     retried and applied once;
//   - RelayRepublish: a relay crash between publish and delete makes its
//     successor publish the same rows again through the transport's sink;
//     each outbox message is applied once;
//   - RelayCrash: business transactions enqueue into the outbox, a relay
//     publishes a batch and dies before deleting it, a second relay
//     publishes those rows again; each outbox message is applied once;
//   - OrderedPerKey: messages of one key are applied in publish order
//     (Features.OrderedPerKey);
//   - DatabaseOutage: the database goes away for a few seconds with a
//     backlog on the subscriber; every message is applied once and in its
//     key's order, and the subscriber logs the outage once when it begins
//     and once when it ends, no line per retried message
//     (Features.OrderedPerKey).
//
// Side effects are counted as rows of a business table without a unique
// constraint, so a double application is seen, never masked. With
// Features.Batch every scenario also runs in batch mode. Scenarios a
// transport cannot support are skipped with the reason, never silently.
//
// A transport's test is then:
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, func(t *testing.T) transporttest.Harness { return newHarness(t) })
//	}
//
// # Lifecycle
//
// [RunTwice] checks that a subscriber is an idemq.Service: Ready once it
// takes work, a concurrent Run refused with idemq.ErrRunning, a Run after
// a Run working.
//
// # Killed processes
//
// A crash is best tested with a process that really dies. The test binary
// re-executes itself as a subscriber child: [KillChildren] starts it with
// a [ChildSpec] in its environment and SIGKILLs it where it announces its
// [KillPoint] (inside the handler with the transaction open, or between
// the commit and the ack); the child's test reads the spec with [Child]
// and builds its subscriber around [ChildConsumer] with
// [ChildSpec.BeforeAck] as its crash point. [Survive] then consumes the
// rest in the test's own process and checks, by counting effect rows and
// reading the inbox, that every message was applied exactly once and none
// was dead-lettered.
package transporttest

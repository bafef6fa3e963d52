// Package inbound is the one settle kernel of idemq's subscribers (the
// kafka-go and franz-go Kafka subscribers, the JetStream and core NATS
// subscribers, the webhook Receiver): what becomes of a message once the
// consumer processed it. [Decide] turns results into a [Plan] without I/O
// (what to acknowledge, what to copy to the dead-letter destination, what
// to hand back, from where to hold and for how long); a [Kernel] adds the
// backoff and the outage log shared by a subscriber's goroutines, and
// [Kernel.Group] runs the rounds of process, plan and settle. A
// subscriber keeps only its client's fetch, produce and commit (a
// [Client]), and the conversion of its records ([IDs]).
package inbound

import (
	"strings"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/errtext"
)

// IDs chooses the id of a delivered message the way every subscriber
// does.
type IDs struct {
	// Consumer validates a header's value as a key.
	Consumer *consumer.Consumer
	// Header names the header holding the id.
	Header string
	// FallbackOnInvalid gives a message whose header the consumer cannot
	// use as a key the fallback id; otherwise the unusable value is kept
	// and the consumer dead-letters the message as invalid, so a producer
	// bug is seen rather than half-deduplicated.
	FallbackOnInvalid bool
	// OtherCase, if set, is called with a header that spells Header in
	// another letter case.
	OtherCase func(name string)
}

// Choose returns the id of a message whose id header holds value (found
// says whether the header was there at all): value, or fallback() for a
// message without the header or, with FallbackOnInvalid, with an
// unusable one.
func (ids IDs) Choose(value string, found bool, fallback func() string) string {
	if !found || (ids.FallbackOnInvalid && ids.Consumer.ValidKey(value) != nil) {
		return fallback()
	}
	return value
}

// Header is a Kafka record header: kafka-go's kafka.Header and franz-go's
// kgo.RecordHeader are both this struct.
type Header interface {
	~struct {
		Key   string
		Value []byte
	}
}

// Record converts a Kafka record with the given value, headers and source
// (the client's record) and chooses its id (fallback: the record's
// topic/partition/offset). Message.Headers holds the last value of a
// repeated name; a nil value (a tombstone) is an empty payload; Delivery
// starts at 1.
func Record[H Header](ids IDs, value []byte, headers []H, source any, fallback func() string) *consumer.Message {
	msg := &consumer.Message{Payload: value, Source: source, Delivery: 1}
	if msg.Payload == nil {
		msg.Payload = []byte{} // a tombstone is a valid message with an empty payload
	}
	if len(headers) > 0 {
		msg.Headers = make(map[string]string, len(headers))
	}
	var id string
	found := false
	for _, h := range headers {
		kv := struct {
			Key   string
			Value []byte
		}(h)
		msg.Headers[kv.Key] = string(kv.Value)
		if kv.Key == ids.Header {
			found, id = true, string(kv.Value)
		} else if ids.OtherCase != nil && strings.EqualFold(kv.Key, ids.Header) {
			ids.OtherCase(kv.Key)
		}
	}
	msg.ID = ids.Choose(id, found, fallback)
	return msg
}

// DeadLetterRecord returns the headers of a Kafka record's dead-letter
// copy: its own, the id header with the record's fallback id if it had
// none (so the copy can be deduplicated downstream), and those of
// [DeadLetterHeaders] with source.
func DeadLetterRecord[H Header](headers []H, idHeader, source string, r consumer.Result) []H {
	out := make([]H, 0, len(headers)+4)
	hasID := false
	for _, h := range headers {
		hasID = hasID || struct {
			Key   string
			Value []byte
		}(h).Key == idHeader
		out = append(out, h)
	}
	if !hasID {
		out = append(out, H{Key: idHeader, Value: []byte(source)})
	}
	for _, h := range DeadLetterHeaders(r, source) {
		out = append(out, H{Key: h[0], Value: []byte(h[1])})
	}
	return out
}

// DeadLetterHeaders are the headers a dead-letter copy carries besides the
// original ones: the error, the outcome, and source (where the message
// came from, such as a Kafka record's topic/partition/offset).
func DeadLetterHeaders(r consumer.Result, source string) [3][2]string {
	return [3][2]string{
		{consumer.HeaderDeadLetterReason, errtext.Of(r.Err)},
		{consumer.HeaderDeadLetterOutcome, r.Outcome.String()},
		{consumer.HeaderDeadLetterSource, source},
	}
}

// CheckTopics is the configuration check of a subscriber's topics: none
// empty, none the dead-letter topic (which would feed the dead letters
// back in).
func CheckTopics(component string, topics []string, deadLetter string) error {
	for _, t := range topics {
		if t == "" || t == deadLetter {
			return idemq.NewConfigError(component, "Topics", "topic %q is empty or the dead-letter topic", t)
		}
	}
	return nil
}

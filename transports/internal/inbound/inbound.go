// Package inbound holds what the Kafka and NATS subscribers decide alike
// about a delivered message.
package inbound

import (
	"strings"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/errtext"
)

// ID returns the id of a message whose id header holds value (found says
// whether the header was there at all). A message without the header gets
// fallback(). So does one whose header the consumer cannot use as a key,
// when fallbackOnInvalid is set; otherwise the unusable value is kept and
// the consumer dead-letters the message as invalid, so a producer bug is
// seen rather than half-deduplicated.
func ID(c *consumer.Consumer, value string, found, fallbackOnInvalid bool, fallback func() string) string {
	if !found || (fallbackOnInvalid && c.ValidKey(value) != nil) {
		return fallback()
	}
	return value
}

// Settled returns how many leading results are settled (applied, a
// duplicate, a conflict, a dead letter): the messages whose offset a Kafka
// subscriber may commit.
func Settled(results []consumer.Result) int {
	n := 0
	for n < len(results) && results[n].Settled() {
		n++
	}
	return n
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

// Message converts a record with the given payload and headers (kv gives
// a header's name and value; the last value wins for a repeated name) and
// chooses its id as [ID] does, with idHeader's value. A nil payload (a
// tombstone) becomes an empty one. otherCase, if set, is called with a
// header that spells idHeader in another letter case.
func Message[H any](c *consumer.Consumer, payload []byte, source any, headers []H, kv func(H) (string, []byte),
	idHeader string, fallbackOnInvalid bool, fallback func() string, otherCase func(name string)) *consumer.Message {
	msg := &consumer.Message{Payload: payload, Source: source}
	if msg.Payload == nil {
		msg.Payload = []byte{} // a tombstone is a valid message with an empty payload
	}
	if len(headers) > 0 {
		msg.Headers = make(map[string]string, len(headers))
	}
	var id string
	found := false
	for _, h := range headers {
		k, v := kv(h)
		msg.Headers[k] = string(v)
		if k == idHeader {
			found, id = true, string(v)
		} else if otherCase != nil && strings.EqualFold(k, idHeader) {
			otherCase(k)
		}
	}
	msg.ID = ID(c, id, found, fallbackOnInvalid, fallback)
	return msg
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

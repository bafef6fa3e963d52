// Package inbound holds what the Kafka and NATS subscribers decide alike
// about a delivered message.
package inbound

import "github.com/idemq/idemq/consumer"

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

package kafka_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
)

// The bad-input suite of the Kafka transport (issue 23): each careless
// setting gets an idemq.ErrConfig naming the field, at construction.

// TestBadInputSubMillisecondDurationsRefused: the durations the Kafka
// protocol sends in whole milliseconds (the group timeouts, a fetch's
// MaxWait) are refused below 1ms instead of reaching the broker as 0, and
// 1ms itself is accepted.
func TestBadInputSubMillisecondDurationsRefused(t *testing.T) {
	t.Parallel()
	st := newSetup(t)
	for field, set := range map[string]func(*idemqkafka.SubscriberConfig, time.Duration){
		"SessionTimeout":    func(c *idemqkafka.SubscriberConfig, d time.Duration) { c.SessionTimeout = d },
		"RebalanceTimeout":  func(c *idemqkafka.SubscriberConfig, d time.Duration) { c.RebalanceTimeout = d },
		"HeartbeatInterval": func(c *idemqkafka.SubscriberConfig, d time.Duration) { c.HeartbeatInterval = d },
		"MaxWait":           func(c *idemqkafka.SubscriberConfig, d time.Duration) { c.MaxWait = d },
	} {
		for _, d := range []time.Duration{time.Nanosecond, 999 * time.Microsecond} {
			cfg := subscriberConfig(st.k, "g")
			set(&cfg, d)
			_, err := idemqkafka.NewSubscriber(st.c, cfg)
			var ce *idemq.ConfigError
			if !errors.Is(err, idemq.ErrConfig) || !errors.As(err, &ce) || ce.Field != field {
				t.Errorf("%s = %v: error %v, want an idemq.ErrConfig naming %s", field, d, err, field)
			}
		}
	}
	cfg := subscriberConfig(st.k, "g")
	cfg.SessionTimeout, cfg.RebalanceTimeout, cfg.MaxWait = 2*time.Millisecond, time.Millisecond, time.Millisecond
	cfg.HeartbeatInterval = time.Millisecond
	if _, err := idemqkafka.NewSubscriber(st.c, cfg); err != nil {
		t.Fatalf("1ms settings: %v, want them accepted", err)
	}
}

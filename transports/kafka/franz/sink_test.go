package franz_test

import (
	"testing"

	"github.com/idemq/idemq/relay/relaytest"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/kafka/franz"
)

// Both sinks pass the relay's Sink conformance suite on two topics; the
// failing destination maps to no topic. The suite's messages all carry
// partition 0 and lease token 0: the TxSink publishes each batch as one
// transaction, read back by a read_committed consumer.
func TestSinkConformance(t *testing.T) {
	relaytest.TestSink(t, func(t *testing.T) relaytest.Target {
		k := testenv.Kafka(t, 2, "a", "b")
		return relaytest.Target{Sink: newSink(t, k), Destinations: []string{k.Topic("a"), k.Topic("b")}, Failing: "fail", Received: receivedFn(k)}
	})
}

func TestTxSinkConformance(t *testing.T) {
	relaytest.TestSink(t, func(t *testing.T) relaytest.Target {
		k := testenv.Kafka(t, 2, "a", "b")
		return relaytest.Target{Sink: newTxSink(t, k, franz.TxConfig{}), Destinations: []string{k.Topic("a"), k.Topic("b")}, Failing: "fail", Received: receivedFn(k)}
	})
}

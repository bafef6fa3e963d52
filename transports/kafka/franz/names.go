package franz

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/idemq/idemq"
)

// maxTopicLen is the longest topic name Kafka accepts.
const maxTopicLen = 249

// topicProblem says why Kafka would refuse the topic name (its
// Topic.validate): empty, "." or "..", longer than 249 bytes, or with a
// byte outside [a-zA-Z0-9._-]; "" for a name it accepts.
func topicProblem(name string) string {
	switch {
	case name == "":
		return "is empty"
	case name == "." || name == "..":
		return fmt.Sprintf("%q is not a topic name Kafka accepts", name)
	case len(name) > maxTopicLen:
		return fmt.Sprintf("is %d bytes long, Kafka accepts at most %d", len(name), maxTopicLen)
	}
	if i := strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
	}); i >= 0 {
		return fmt.Sprintf("%q has %q at byte %d: Kafka accepts ASCII letters, digits, '.', '_' and '-'", name, name[i], i)
	}
	return ""
}

// checkTopic is topicProblem as the ConfigError of field.
func checkTopic(component, field, name string) error {
	if p := topicProblem(name); p != "" {
		return idemq.NewConfigError(component, field, "%s", p)
	}
	return nil
}

// TxNames returns the transactional id prefix and the watermark topic a
// [TxSink] of outbox (a name from relay.OutboxName) uses when
// [TxConfig] leaves them empty: "idemq-tx-" and "idemq-watermarks-"
// followed by 16 hex digits of a SHA-256 of the outbox's name, the same in
// every process of the outbox and different for every other outbox
// (another table, database or Postgres cluster), so that two outboxes on
// one Kafka cluster neither fence each other nor read each other's
// watermarks.
func TxNames(outbox string) (transactionalIDPrefix, watermarkTopic string) {
	sum := sha256.Sum256([]byte(outbox))
	h := hex.EncodeToString(sum[:8])
	return "idemq-tx-" + h + "-", "idemq-watermarks-" + h
}

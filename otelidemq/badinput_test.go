package otelidemq_test

import (
	"go/parser"
	"go/token"
	"regexp"
	"strings"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/request"
)

// The bad-input suite of otelidemq (issue 23): what an operator reads on a
// dashboard must be explained in the package documentation.

// TestBadInputEveryEmittedAttributeValueIsDocumented: every value the
// metrics put in idemq.outcome (consumer.Outcome), idemq.result
// (request.Result) and idemq.relay.hold_reason is named in the package
// documentation, so a new value (such as request.ResultMisconfigured)
// cannot ship undocumented.
func TestBadInputEveryEmittedAttributeValueIsDocumented(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	doc := f.Doc.Text()
	documented := func(attr, value string) {
		t.Helper()
		// The value as a word of its own: "conflict" is not found in "conflicts".
		if !regexp.MustCompile(`(^|[\s(,])` + regexp.QuoteMeta(value) + `([\s),.:]|$)`).MatchString(doc) {
			t.Errorf("%s value %q is emitted but not named in the package documentation", attr, value)
		}
	}
	for o := consumer.Outcome(1); !strings.HasPrefix(o.String(), "Outcome("); o++ {
		documented("idemq.outcome", o.String())
	}
	for r := request.Result(1); !strings.HasPrefix(r.String(), "Result("); r++ {
		documented("idemq.result", r.String())
	}
	for _, reason := range []string{relay.HoldNoRoute, relay.HoldSink} {
		documented("idemq.relay.hold_reason", reason)
	}
}

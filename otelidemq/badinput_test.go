package otelidemq_test

import (
	"errors"
	"go/parser"
	"go/token"
	"regexp"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/otelidemq"
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

// TestBadInputTypedNilProvidersAreRefused: a typed-nil MeterProvider,
// TracerProvider or Propagator (a provider variable never assigned) is
// refused by New with an ErrConfig naming the field, instead of
// panicking on first use; nil fields still take the global ones.
func TestBadInputTypedNilProvidersAreRefused(t *testing.T) {
	var (
		mp *sdkmetric.MeterProvider
		tp *sdktrace.TracerProvider
		pr *propagation.TraceContext
	)
	for field, cfg := range map[string]otelidemq.Config{
		"MeterProvider":  {MeterProvider: mp},
		"TracerProvider": {TracerProvider: tp},
		"Propagator":     {Propagator: pr},
	} {
		_, err := otelidemq.New(cfg)
		if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != field || !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("New with a typed-nil %s: %v, want an ErrConfig naming it", field, err)
		}
	}
	if _, err := otelidemq.New(otelidemq.Config{}); err != nil {
		t.Errorf("New(Config{}) = %v, want the global providers", err)
	}
}

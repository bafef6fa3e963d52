package otelidemq

import (
	"context"
	"errors"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/request/idemgrpc"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/transports/webhook"
)

// Hooks carry no context; the measurements are not tied to a span.
var bg = context.Background()

type consumerInstruments struct {
	duration          metric.Float64Histogram
	messages, retries metric.Int64Counter
}

// ConsumerHooks returns consumer hooks that record the consumer metrics,
// then call next's.
func (t *Telemetry) ConsumerHooks(next consumer.Hooks) consumer.Hooks {
	in := t.consumer
	return consumer.Hooks{
		OnResult: func(e consumer.ResultEvent) {
			scope, outcome := keyScope.String(e.Scope), keyOutcome.String(e.Outcome.String())
			in.messages.Add(bg, 1, metric.WithAttributeSet(attribute.NewSet(scope, outcome)))
			in.duration.Record(bg, e.Duration.Seconds(), metric.WithAttributeSet(attribute.NewSet(processOperation, scope, outcome)))
			if next.OnResult != nil {
				next.OnResult(e)
			}
		},
		OnRetried: func(e consumer.RetriedEvent) {
			in.retries.Add(bg, 1, metric.WithAttributes(keyScope.String(e.Scope)))
			if next.OnRetried != nil {
				next.OnRetried(e)
			}
		},
	}
}

type relayInstruments struct {
	sent, failures, held, skipped, retries, deadLetters metric.Int64Counter
	duration                                            metric.Float64Histogram
	pending, dead, unrouted                             metric.Int64Gauge
	oldest                                              metric.Float64Gauge
}

var (
	sendOperation    = semconv.MessagingOperationName("send")
	processOperation = semconv.MessagingOperationName("process")
)

// RelayHooks returns relay hooks that record the relay and outbox metrics,
// then call next's.
func (t *Telemetry) RelayHooks(next relay.Hooks) relay.Hooks {
	in := t.relay
	byDestination := func(c metric.Int64Counter, m relay.Message) {
		c.Add(bg, 1, metric.WithAttributes(semconv.MessagingDestinationName(m.Destination)))
	}
	return relay.Hooks{
		OnPublished: func(e relay.PublishedEvent) {
			in.duration.Record(bg, e.Took.Seconds(), metric.WithAttributes(sendOperation))
			for _, m := range e.Messages {
				in.sent.Add(bg, 1, metric.WithAttributes(sendOperation, semconv.MessagingDestinationName(m.Destination)))
			}
			if next.OnPublished != nil {
				next.OnPublished(e)
			}
		},
		OnFailed: func(e relay.FailedEvent) {
			byDestination(in.failures, e.Message)
			if next.OnFailed != nil {
				next.OnFailed(e)
			}
		},
		OnHeld: func(e relay.HeldEvent) {
			in.held.Add(bg, 1, metric.WithAttributes(semconv.MessagingDestinationName(e.Message.Destination), keyReason.String(relay.HoldReason(e.Err))))
			if next.OnHeld != nil {
				next.OnHeld(e)
			}
		},
		OnSkipped: func(e relay.SkippedEvent) {
			byDestination(in.skipped, e.Message)
			if next.OnSkipped != nil {
				next.OnSkipped(e)
			}
		},
		OnRetried: func(e relay.RetriedEvent) {
			byDestination(in.retries, e.Message)
			if next.OnRetried != nil {
				next.OnRetried(e)
			}
		},
		OnDeadLettered: func(e relay.DeadLetteredEvent) {
			byDestination(in.deadLetters, e.Message)
			if next.OnDeadLettered != nil {
				next.OnDeadLettered(e)
			}
		},
		OnBacklog: func(e relay.BacklogEvent) {
			in.pending.Record(bg, e.Stats.Pending)
			in.oldest.Record(bg, e.Stats.OldestPending.Seconds())
			in.dead.Record(bg, e.Stats.Dead)
			in.unrouted.Record(bg, e.Stats.Unrouted)
			if next.OnBacklog != nil {
				next.OnBacklog(e)
			}
		},
	}
}

// HTTPHooks returns middleware hooks that count requests by result, put
// the result on the request's span (idemq.result, on otelhttp's server
// span for instance), then call next's.
func (t *Telemetry) HTTPHooks(next idemhttp.Hooks) idemhttp.Hooks {
	return idemhttp.Hooks{OnResult: func(e idemhttp.ResultEvent) {
		t.countRequest("http", e.Result.String())
		if e.Request != nil {
			trace.SpanFromContext(e.Request.Context()).SetAttributes(keyResult.String(e.Result.String()))
		}
		if next.OnResult != nil {
			next.OnResult(e)
		}
	}}
}

// GRPCHooks returns server interceptor hooks that count calls by result,
// then call next's.
func (t *Telemetry) GRPCHooks(next idemgrpc.ServerHooks) idemgrpc.ServerHooks {
	return idemgrpc.ServerHooks{OnResult: func(e idemgrpc.ResultEvent) {
		t.countRequest("grpc", e.Result.String())
		if next.OnResult != nil {
			next.OnResult(e)
		}
	}}
}

func (t *Telemetry) countRequest(transport, result string) {
	t.request.Add(bg, 1, metric.WithAttributes(keyTransport.String(transport), keyResult.String(result)))
}

type webhookInstruments struct {
	deliveries, disabled metric.Int64Counter
	duration             metric.Float64Histogram
}

// WebhookHooks returns webhook Sink hooks that record deliveries by
// endpoint and class of answer, then call next's.
func (t *Telemetry) WebhookHooks(next webhook.Hooks) webhook.Hooks {
	in := t.webhook
	record := func(endpoint, class string, seconds float64) {
		set := metric.WithAttributeSet(attribute.NewSet(keyEndpoint.String(endpoint), keyClass.String(class)))
		in.deliveries.Add(bg, 1, set)
		in.duration.Record(bg, seconds, set)
	}
	return webhook.Hooks{
		OnDelivered: func(e webhook.DeliveredEvent) {
			record(e.Endpoint, statusClass(e.Status), e.Took.Seconds())
			if next.OnDelivered != nil {
				next.OnDelivered(e)
			}
		},
		OnFailed: func(e webhook.FailedEvent) {
			class := "network"
			if de := (*webhook.DeliveryError)(nil); errors.As(e.Err, &de) && de.Status != 0 {
				class = statusClass(de.Status)
			}
			record(e.Endpoint, class, e.Took.Seconds())
			if next.OnFailed != nil {
				next.OnFailed(e)
			}
		},
		OnDisabled: func(e webhook.DisabledEvent) {
			in.disabled.Add(bg, 1, metric.WithAttributes(keyEndpoint.String(e.Endpoint)))
			if next.OnDisabled != nil {
				next.OnDisabled(e)
			}
		},
	}
}

// statusClass maps 204 to "2xx".
func statusClass(status int) string {
	return strconv.Itoa(status/100) + "xx"
}

package nilcheck_test

import (
	"context"
	"io"
	"testing"

	"github.com/idemq/idemq/internal/nilcheck"
)

type sink interface{ Publish() }

type ptrSink struct{}

func (*ptrSink) Publish() {}

type valueSink struct{ n int }

func (valueSink) Publish() {}

type funcSink func()

func (f funcSink) Publish() { f() }

type mapSink map[string]int

func (mapSink) Publish() {}

type sliceSink []int

func (sliceSink) Publish() {}

type chanSink chan int

func (chanSink) Publish() {}

func TestIsNil(t *testing.T) {
	var (
		nilPtr   *ptrSink
		nilFunc  funcSink
		nilMap   mapSink
		nilSlice sliceSink
		nilChan  chanSink
		nilIface sink
		nilCtx   context.Context
		nilAny   any
	)
	for _, tc := range []struct {
		name string
		v    any
		want bool
	}{
		{"untyped nil", nil, true},
		{"nil interface variable", nilIface, true},
		{"nil context.Context", nilCtx, true},
		{"nil any", nilAny, true},
		{"typed-nil pointer in an interface", sink(nilPtr), true},
		{"typed-nil pointer", nilPtr, true},
		{"nil func", sink(nilFunc), true},
		{"nil map", sink(nilMap), true},
		{"nil slice", sink(nilSlice), true},
		{"nil chan", sink(nilChan), true},
		{"pointer", sink(&ptrSink{}), false},
		{"zero struct value", sink(valueSink{}), false},
		{"func", sink(funcSink(func() {})), false},
		{"empty map", sink(mapSink{}), false},
		{"empty slice", sink(sliceSink{}), false},
		{"chan", sink(make(chanSink)), false},
		{"io.Discard", io.Discard, false},
		{"zero int", 0, false},
		{"empty string", "", false},
	} {
		if got := nilcheck.IsNil(tc.v); got != tc.want {
			t.Errorf("IsNil(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

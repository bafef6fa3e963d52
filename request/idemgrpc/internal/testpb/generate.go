// Package testpb holds the Ledger service the gRPC interceptor tests run.
package testpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative ledger.proto

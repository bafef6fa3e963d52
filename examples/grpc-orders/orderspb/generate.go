// Package orderspb is the generated code of the Orders service of the
// grpc-orders example.
package orderspb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative orders.proto

module xio.dev/xio

go 1.26.0

require golang.org/x/net v0.63.0

require golang.org/x/text v0.44.0 // indirect

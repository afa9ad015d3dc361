package main

import (
	"os"
	"testing"
)

// TestMain lets the test binary serve as the AUSF and the UDM too.
func TestMain(m *testing.M) {
	if asNF() {
		return
	}
	os.Exit(m.Run())
}

// The case study end to end over both transports: every authentication
// succeeds (each one checked by the AMF: HXRES*, the result, the SUPI).
func TestAuthenticationsOverTCPAndXio(t *testing.T) {
	res, err := run(50, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range []string{"tcp", "xio"} {
		if len(res[tr]) != 50 {
			t.Fatalf("%s: %d authentications", tr, len(res[tr]))
		}
		t.Logf("%s: p50 %v", tr, res[tr][25])
	}
}

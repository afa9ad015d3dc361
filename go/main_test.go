package xio

import (
	"fmt"
	"os"
	"testing"
)

// testManager is the manager of the tests' pool, in this process.
var testManager *Manager

// TestMain runs the tests against a manager of their own, in a run
// directory of their own, as the process-wide pool ($XIO_PREFIX).
func TestMain(m *testing.M) {
	// The refused child of TestRefusedOutsideTheDomain: its pool is the
	// one its parent names.
	if os.Getenv(domainChildEnv) != "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "xio-go-test-")
	if err != nil {
		panic(err)
	}
	prefix := fmt.Sprintf("gotest-%d", os.Getpid())
	os.Setenv("XIO_RUN_DIR", dir)
	os.Setenv("XIO_PREFIX", prefix)
	// A loaded machine may keep the manager's thread off the CPU for a
	// while: tests wait longer than the 5 s default before calling it
	// unresponsive (as ./scripts/test.sh does for the Rust tests).
	if os.Getenv("XIO_CONTROL_TIMEOUT_MS") == "" {
		os.Setenv("XIO_CONTROL_TIMEOUT_MS", "60000")
	}
	testManager, err = StartManager(prefix)
	if err != nil {
		panic(err)
	}
	code := m.Run()
	testManager.Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

package xio

// #include "xio_go.h"
import "C"

import (
	"fmt"
	"unsafe"
)

// Manager is a pool's manager running on a thread of this process: for
// tests, examples and single-binary services (deployments run the
// xio-manager binary). It is the same code as the binary.
type Manager struct {
	c      *C.xio_manager
	prefix string
}

// StartManager starts the manager of pool prefix in this process, with
// the default buffer classes. It fails with an error wrapping
// ErrManagerRunning if another manager has the prefix.
func StartManager(prefix string) (*Manager, error) {
	cs := C.CString(prefix)
	defer C.free(unsafe.Pointer(cs))
	var e errBuf
	m := &Manager{prefix: prefix}
	if err := e.err(C.xg_manager_spawn(cs, &m.c, &e[0])); err != nil {
		return nil, fmt.Errorf("xio: start manager: %w", err)
	}
	return m, nil
}

// Prefix is the pool's prefix.
func (m *Manager) Prefix() string { return m.prefix }

// Stop stops the manager and waits for it: its pool goes with it, and
// the services attached see it gone.
func (m *Manager) Stop() error {
	var e errBuf
	err := e.err(C.xg_manager_stop(m.c, &e[0]))
	m.c = nil
	return err
}

// ManagerStats is what a manager holds now.
type ManagerStats struct {
	// Stacks attached (each Net is one).
	Stacks int
	// Channels between pairs of stacks.
	Channels int
	// BuffersTotal is the pool's buffers, all classes; BuffersFree those
	// free now (equal when no process holds any).
	BuffersTotal, BuffersFree int
	// Deaths counts processes that died or left (once their buffers are
	// back); Reclaimed the buffers taken back from them.
	Deaths, Reclaimed uint64
}

// Stats reports what the manager holds now.
func (m *Manager) Stats() (ManagerStats, error) {
	var e errBuf
	var st C.xio_manager_stats
	if err := e.err(C.xg_manager_stats(m.c, &st, &e[0])); err != nil {
		return ManagerStats{}, err
	}
	return ManagerStats{
		Stacks:       int(st.stacks),
		Channels:     int(st.channels),
		BuffersTotal: int(st.buffers_total),
		BuffersFree:  int(st.buffers_free),
		Deaths:       uint64(st.deaths),
		Reclaimed:    uint64(st.reclaimed),
	}, nil
}

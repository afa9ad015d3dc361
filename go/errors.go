package xio

// #include "xio_go.h"
import "C"

import (
	"errors"
	"syscall"
)

// Result codes of xio.h (stable across versions).
const (
	codeOK               = C.XIO_OK
	codeInvalidArgument  = C.XIO_ERR_INVALID_ARGUMENT
	codeWouldBlock       = C.XIO_ERR_WOULD_BLOCK
	codeTimedOut         = C.XIO_ERR_TIMED_OUT
	codeNoManager        = C.XIO_ERR_NO_MANAGER
	codeRefused          = C.XIO_ERR_CONNECTION_REFUSED
	codeReset            = C.XIO_ERR_CONNECTION_RESET
	codeNotConnected     = C.XIO_ERR_NOT_CONNECTED
	codeAddrInUse        = C.XIO_ERR_ADDR_IN_USE
	codeTooLarge         = C.XIO_ERR_TOO_LARGE
	codeManagerGone      = C.XIO_ERR_MANAGER_GONE
	codeBusy             = C.XIO_ERR_BUSY
	codeBrokenPipe       = C.XIO_ERR_BROKEN_PIPE
	codeForked           = C.XIO_ERR_FORKED
	codeNoSpace          = C.XIO_ERR_NO_SPACE
	codePeerBusy         = C.XIO_ERR_PEER_BUSY
	codeManagerRunning   = C.XIO_ERR_MANAGER_RUNNING
	codePermission       = C.XIO_ERR_PERMISSION_DENIED
	codeInvalidHandle    = C.XIO_ERR_INVALID_HANDLE
	codeProtocol         = C.XIO_ERR_PROTOCOL
	codeInternal         = C.XIO_ERR_INTERNAL
	codeSystemCallFailed = C.XIO_ERR_IO
)

// Errors an [Error] wraps where no system error number says the same.
// Compare with [errors.Is].
var (
	// ErrNoManager: no manager runs for the pool's prefix (start one with
	// `xio-manager --prefix P`, or in the process with [StartManager]).
	ErrNoManager = errors.New("xio: no manager for this pool prefix")
	// ErrManagerGone: the pool's manager went away. Connections already
	// made keep working; new listens and dials fail until the process
	// attaches to a restarted one.
	ErrManagerGone = errors.New("xio: the manager went away")
	// ErrPeerBusy: a process on this node binds the address but does not
	// read its control socket (stopped, stuck), so no new connection is
	// made to it. The service is here: this is no reason to dial TCP.
	ErrPeerBusy = errors.New("xio: the process bound to the address is not answering")
	// ErrManagerRunning: another manager already runs for the prefix.
	ErrManagerRunning = errors.New("xio: another manager runs for this pool prefix")
	// ErrForked: the handle was inherited across fork.
	ErrForked = errors.New("xio: handle inherited across fork")
)

// Error is a failed X-IO call: its xio.h result code and the library's
// message. It unwraps to the system error number a socket would have
// given (syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE, ...)
// or to one of this package's Err values, so errors.Is works as with
// the net package's errors.
type Error struct {
	// Code is the xio.h result code (XIO_ERR_...).
	Code int
	// Msg is the library's message (what xio_last_error said).
	Msg string
}

func (e *Error) Error() string {
	if e.Msg != "" {
		return e.Msg
	}
	return C.GoString(C.xio_strerror(C.xio_result(e.Code)))
}

// Timeout reports whether the call timed out.
func (e *Error) Timeout() bool { return e.Code == codeTimedOut }

// Unwrap gives the system error number or package error the code means.
func (e *Error) Unwrap() error {
	switch e.Code {
	case codeInvalidArgument, codeInvalidHandle:
		return syscall.EINVAL
	case codeWouldBlock:
		return syscall.EAGAIN
	case codeTimedOut:
		return syscall.ETIMEDOUT
	case codeNoManager:
		return ErrNoManager
	case codeRefused:
		return syscall.ECONNREFUSED
	case codeReset:
		return syscall.ECONNRESET
	case codeNotConnected:
		return syscall.ENOTCONN
	case codeAddrInUse:
		return syscall.EADDRINUSE
	case codeTooLarge:
		return syscall.EMSGSIZE
	case codeManagerGone:
		return ErrManagerGone
	case codeBusy:
		return syscall.EBUSY
	case codeBrokenPipe:
		return syscall.EPIPE
	case codeForked:
		return ErrForked
	case codeNoSpace:
		return syscall.ENOSPC
	case codePeerBusy:
		return ErrPeerBusy
	case codeManagerRunning:
		return ErrManagerRunning
	case codePermission:
		// errors.Is(err, os.ErrPermission) holds, as for a socket.
		return syscall.EACCES
	case codeProtocol:
		return syscall.EPROTO
	case codeSystemCallFailed:
		return syscall.EIO
	}
	return nil
}

// errBuf receives a failing call's message (see xio_go.h).
type errBuf [C.XG_ERR]C.char

// err makes the error of result code r (nil for XIO_OK).
func (b *errBuf) err(r C.xio_result) error {
	if r == codeOK {
		return nil
	}
	return &Error{Code: int(r), Msg: C.GoString(&b[0])}
}

package lease

import (
	"time"

	"github.com/atcr-io/appview/internal/fence"
)

// NoWake is WakeCmd.At when nothing is due.
const NoWake time.Duration = -1

// Input is an event fed to the Machine. StopRequested and Nudge are also
// the messages the LeaseActor takes from outside (as pointers).
type Input interface{ isInput() }

// Inputs. Each answer carries the Seq of the command it answers.
type (
	Start struct{}
	Tick  struct{} // a WakeCmd's wake-up
	// StopRequested asks for a graceful stop: the worker drains while
	// renewals go on, then the lease is released and the actor stops.
	StopRequested struct{}
	// Nudge says a holder has just released: a contender tries at once.
	Nudge struct{}
	// AcquireResult: At is when the call returned (lease.acquired's time).
	AcquireResult struct {
		Seq   uint64
		Grant Grant
		Err   error
		At    time.Time
	}
	// RenewResult: Err wraps fence.ErrSuperseded when the row no longer
	// matched.
	RenewResult struct {
		Seq uint64
		Err error
	}
	// ReleaseResult: At is when the call began, before the release
	// committed, so lease.released precedes any successor's grant.
	ReleaseResult struct {
		Seq uint64
		Err error
		At  time.Time
	}
	WorkerTerminated struct{ Gen int }
	// WorkerPanicked: the worker is suspended until restarted or stopped.
	WorkerPanicked struct {
		Gen    int
		Reason error
	}
	// YieldRequested: the worker has reported unhealthy for the yield
	// grace and a contender reports healthy. Taken only while holding,
	// once custody has lasted the minimum hold: the worker drains, the
	// lease is released (reason yielded) and not contended for one TTL.
	YieldRequested struct{ Reason error }
)

func (Start) isInput()            {}
func (Tick) isInput()             {}
func (StopRequested) isInput()    {}
func (Nudge) isInput()            {}
func (AcquireResult) isInput()    {}
func (RenewResult) isInput()      {}
func (ReleaseResult) isInput()    {}
func (WorkerTerminated) isInput() {}
func (WorkerPanicked) isInput()   {}
func (YieldRequested) isInput()   {}

// Command is an action the Machine asks its shell to carry out.
type Command interface{ isCommand() }

// Commands. A store call is answered with the result of the same Seq.
type (
	AcquireCmd struct{ Seq uint64 }
	RenewCmd   struct {
		Seq     uint64
		Custody fence.Custody
	}
	ReleaseCmd struct {
		Seq     uint64
		Custody fence.Custody
	}
	SpawnWorkerCmd struct {
		Gen     int
		Custody fence.Custody
	}
	// RestartWorkerCmd restarts the failed (suspended) worker in place.
	RestartWorkerCmd struct{ Gen int }
	// StopWorkerCmd: Graceful sends the worker Drain and lets it finish
	// its mailbox (poison); otherwise it stops after the current message.
	StopWorkerCmd struct {
		Gen      int
		Graceful bool
	}
	// EmitCmd publishes Event (stamped now unless Event.At is set).
	EmitCmd struct{ Event Event }
	// WakeCmd asks for a Tick at At on the machine's clock (NoWake: none).
	WakeCmd     struct{ At time.Duration }
	FinishedCmd struct{}
)

func (AcquireCmd) isCommand()       {}
func (RenewCmd) isCommand()         {}
func (ReleaseCmd) isCommand()       {}
func (SpawnWorkerCmd) isCommand()   {}
func (RestartWorkerCmd) isCommand() {}
func (StopWorkerCmd) isCommand()    {}
func (EmitCmd) isCommand()          {}
func (WakeCmd) isCommand()          {}
func (FinishedCmd) isCommand()      {}

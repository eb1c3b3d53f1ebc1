//! The agent's life as a state machine, without I/O: what each logind event (and the end of a
//! shutdown, and SIGTERM) changes and which steps the event loop must take. The loop in
//! `agent.rs` only carries the steps out.

/// Where the node is in its shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Up; the delay lock is wanted.
    Running,
    /// PrepareForShutdown(true) came: pods are being terminated.
    ShuttingDown,
    /// The pods' termination is over and the lock released: the machine is going down.
    Done,
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    PrepareForShutdown(bool),
    LogindStopped,
    LogindStarted,
    /// The pods' termination ended (finished, or out of budget).
    ShutdownFinished,
    /// SIGTERM.
    Stop,
}

/// What the loop must do, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Mark the node and terminate its pods within the budget from now.
    StartShutdown,
    /// Carry on a shutdown that began before the agent started: no new markings, the budget
    /// counted from the recorded start.
    ResumeShutdown,
    /// Drop the running termination, record the cancel, unmark the node.
    CancelShutdown,
    /// Take the delay lock if none is held.
    TakeLock,
    /// logind left: keep the lock's fd (a restarted logind restores it) until a fresh one is
    /// held; report not ready meanwhile.
    ParkLock,
    /// Release every lock: the shutdown may proceed.
    ReleaseLock,
    /// Record and report the finished shutdown.
    RecordFinish,
    /// A fresh boot: markings left by an earlier shutdown go.
    ClearStaleMarks,
    /// logind grants no lock while it shuts down: say so, report ready, carry on without.
    ResumeWithoutLock,
    Exit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    pub phase: Phase,
    pub logind_up: bool,
    /// SIGTERM came during a shutdown: exit once it is finished.
    pub stop_requested: bool,
}

impl Lifecycle {
    /// At start-up. A shutdown is resumed when logind is already shutting down, or when the
    /// state file records one of this boot that never ended (the agent crashed mid-way):
    /// carried on, never undone.
    pub fn start(recorded_in_progress: bool, logind_preparing: bool) -> (Self, Vec<Step>) {
        let resume = recorded_in_progress || logind_preparing;
        let lifecycle = Self {
            phase: if resume {
                Phase::ShuttingDown
            } else {
                Phase::Running
            },
            logind_up: true,
            stop_requested: false,
        };
        let steps = if logind_preparing {
            // logind answers Inhibit with OperationInProgress now.
            vec![Step::ResumeWithoutLock, Step::ResumeShutdown]
        } else if resume {
            vec![Step::TakeLock, Step::ResumeShutdown]
        } else {
            vec![Step::ClearStaleMarks, Step::TakeLock]
        };
        (lifecycle, steps)
    }

    /// Whether a missing lock should be asked for now (retried every second while true).
    pub fn lock_wanted(&self) -> bool {
        self.phase == Phase::Running && self.logind_up
    }

    pub fn on(&mut self, input: Input) -> Vec<Step> {
        match (self.phase, input) {
            (Phase::Running, Input::PrepareForShutdown(true)) => {
                self.phase = Phase::ShuttingDown;
                vec![Step::StartShutdown]
            }
            // A cancel undoes the shutdown whether the pods are still being stopped or already
            // done (logind may cancel after the lock went); the node takes pods again.
            (Phase::ShuttingDown | Phase::Done, Input::PrepareForShutdown(false)) => {
                self.phase = Phase::Running;
                self.stop_requested = false;
                let mut steps = vec![Step::CancelShutdown];
                if self.logind_up {
                    steps.push(Step::TakeLock);
                }
                steps
            }
            (Phase::ShuttingDown, Input::ShutdownFinished) => {
                self.phase = Phase::Done;
                let mut steps = vec![Step::ReleaseLock, Step::RecordFinish];
                if self.stop_requested {
                    steps.push(Step::Exit);
                }
                steps
            }
            (_, Input::LogindStopped) => {
                self.logind_up = false;
                vec![Step::ParkLock]
            }
            (_, Input::LogindStarted) => {
                self.logind_up = true;
                if self.phase == Phase::Running {
                    vec![Step::TakeLock]
                } else {
                    Vec::new()
                }
            }
            // SIGTERM mid-shutdown: the node is going down anyway; finish first.
            (Phase::ShuttingDown, Input::Stop) => {
                self.stop_requested = true;
                Vec::new()
            }
            (_, Input::Stop) => vec![Step::Exit],
            // A repeated PrepareForShutdown(true), a cancel with nothing to cancel, a finish
            // after a cancel: nothing to do.
            (
                Phase::Running | Phase::ShuttingDown | Phase::Done,
                Input::PrepareForShutdown(_) | Input::ShutdownFinished,
            ) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Input::{LogindStarted, LogindStopped, PrepareForShutdown, ShutdownFinished, Stop};
    use Phase::{Done, Running, ShuttingDown};
    use Step::{
        CancelShutdown, ClearStaleMarks, Exit, ParkLock, RecordFinish, ReleaseLock, ResumeShutdown,
        ResumeWithoutLock, StartShutdown, TakeLock,
    };

    fn state(phase: Phase, logind_up: bool, stop_requested: bool) -> Lifecycle {
        Lifecycle {
            phase,
            logind_up,
            stop_requested,
        }
    }

    // The table of every event in every phase reads best whole.
    #[allow(clippy::too_many_lines)]
    #[test]
    fn every_event_in_every_phase() {
        let cases = [
            // (before, input, steps, after)
            (
                state(Running, true, false),
                PrepareForShutdown(true),
                vec![StartShutdown],
                state(ShuttingDown, true, false),
            ),
            (
                state(ShuttingDown, true, false),
                PrepareForShutdown(true),
                vec![],
                state(ShuttingDown, true, false),
            ),
            (
                state(Done, true, false),
                PrepareForShutdown(true),
                vec![],
                state(Done, true, false),
            ),
            (
                state(Running, true, false),
                PrepareForShutdown(false),
                vec![],
                state(Running, true, false),
            ),
            (
                state(ShuttingDown, true, true),
                PrepareForShutdown(false),
                vec![CancelShutdown, TakeLock],
                state(Running, true, false),
            ),
            (
                state(Done, true, false),
                PrepareForShutdown(false),
                vec![CancelShutdown, TakeLock],
                state(Running, true, false),
            ),
            (
                state(ShuttingDown, false, false),
                PrepareForShutdown(false),
                vec![CancelShutdown],
                state(Running, false, false),
            ),
            (
                state(ShuttingDown, true, false),
                ShutdownFinished,
                vec![ReleaseLock, RecordFinish],
                state(Done, true, false),
            ),
            (
                state(ShuttingDown, true, true),
                ShutdownFinished,
                vec![ReleaseLock, RecordFinish, Exit],
                state(Done, true, true),
            ),
            (
                state(Running, true, false),
                ShutdownFinished,
                vec![],
                state(Running, true, false),
            ),
            (
                state(Running, true, false),
                LogindStopped,
                vec![ParkLock],
                state(Running, false, false),
            ),
            (
                state(ShuttingDown, true, false),
                LogindStopped,
                vec![ParkLock],
                state(ShuttingDown, false, false),
            ),
            (
                state(Running, false, false),
                LogindStarted,
                vec![TakeLock],
                state(Running, true, false),
            ),
            (
                state(ShuttingDown, false, false),
                LogindStarted,
                vec![],
                state(ShuttingDown, true, false),
            ),
            (
                state(Done, false, false),
                LogindStarted,
                vec![],
                state(Done, true, false),
            ),
            (
                state(Running, true, false),
                Stop,
                vec![Exit],
                state(Running, true, false),
            ),
            (
                state(ShuttingDown, true, false),
                Stop,
                vec![],
                state(ShuttingDown, true, true),
            ),
            (
                state(Done, true, false),
                Stop,
                vec![Exit],
                state(Done, true, false),
            ),
        ];
        for (before, input, steps, after) in cases {
            let mut lifecycle = before;
            assert_eq!(lifecycle.on(input), steps, "{before:?} + {input:?}");
            assert_eq!(lifecycle, after, "{before:?} + {input:?}");
        }
    }

    #[test]
    fn the_lock_is_wanted_only_while_running_with_logind_up() {
        assert!(state(Running, true, false).lock_wanted());
        assert!(!state(Running, false, false).lock_wanted());
        assert!(!state(ShuttingDown, true, false).lock_wanted());
        assert!(!state(Done, true, false).lock_wanted());
    }

    #[test]
    fn start_up_resumes_or_takes_the_lock() {
        let cases = [
            // (recorded in progress, logind preparing, phase, steps)
            (false, false, Running, vec![ClearStaleMarks, TakeLock]),
            (true, false, ShuttingDown, vec![TakeLock, ResumeShutdown]),
            (
                false,
                true,
                ShuttingDown,
                vec![ResumeWithoutLock, ResumeShutdown],
            ),
            (
                true,
                true,
                ShuttingDown,
                vec![ResumeWithoutLock, ResumeShutdown],
            ),
        ];
        for (recorded, preparing, phase, steps) in cases {
            assert_eq!(
                Lifecycle::start(recorded, preparing),
                (state(phase, true, false), steps),
                "recorded {recorded}, preparing {preparing}"
            );
        }
    }
}

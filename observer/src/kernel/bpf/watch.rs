//! The failed-write hook on demand (`tp_btf` set only). A write the kernel
//! fails before sending (on a client socket reset or timed out while idle)
//! is seen only by `sock_send_length`, which runs on every `sendmsg` of
//! every socket on the host while it is attached. So it is attached only
//! while such a socket waits for its application: the probes count them
//! in `FAILED_WRITE_WATCH` and send a `WATCH` record when one dies while
//! the hook is off; this attaches the hook then (or at the next tick, if
//! the record was lost) and detaches it once the count has stayed 0 for
//! [`LINGER`]. A socket that died before the hook came is marked by the
//! probes and settled at its destroy (see `counter::FAILED_WRITE_UNSEEN`).

use std::time::{Duration, Instant};

use aya::{
    maps::{Array, MapData},
    programs::{tp_btf::BtfTracePointLinkId, BtfTracePoint, ProgramError},
    Btf as AyaBtf, Ebpf,
};
use observer_common::maps;

use super::{load::take_map, Attached, BpfError, Hook};

/// How long the count must stay 0 before the hook is detached: a host
/// whose sockets keep dying idle keeps it, instead of paying an attach
/// (an RCU grace period on the event thread) for each death.
pub(crate) const LINGER: Duration = Duration::from_secs(5);

/// Slots of `FAILED_WRITE_WATCH`.
const PENDING: u32 = 0;
const WATCHING: u32 = 1;

/// Where the hook is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Off,
    /// Attached and flagged; `quiet_since` is when the count was first
    /// seen at 0 (None while sockets wait).
    On {
        quiet_since: Option<Instant>,
    },
    /// Attached, the flag cleared at the last tick: a death from now on is
    /// marked unwatched. Detached at the next tick unless a socket waits:
    /// a death that read the flag still set had counted itself before, so
    /// the count shows it by then.
    Closing,
}

/// The failed-write hook and the probes' count of the sockets that need it.
pub(crate) struct FailedWriteWatch {
    program: &'static str,
    slots: Array<MapData, u64>,
    link: Option<BtfTracePointLinkId>,
    phase: Phase,
    attaches: u64,
}

impl FailedWriteWatch {
    /// Load `hook`'s program without attaching it.
    pub(crate) fn load(ebpf: &mut Ebpf, hook: Hook, btf: &AyaBtf) -> Result<(Self, Attached), BpfError> {
        let err = |source| BpfError::Program { name: hook.program, source };
        let prog: &mut BtfTracePoint =
            ebpf.program_mut(hook.program).ok_or(err(ProgramError::NotLoaded))?.try_into().map_err(err)?;
        prog.load(hook.name, btf).map_err(err)?;
        let attached = Attached { hook, prog_id: prog.info().map_err(err)?.id(), on_demand: true };
        let slots = take_map(ebpf, maps::FAILED_WRITE_WATCH)?;
        Ok((Self { program: hook.program, slots, link: None, phase: Phase::Off, attaches: 0 }, attached))
    }

    fn program<'a>(&self, ebpf: &'a mut Ebpf) -> Result<&'a mut BtfTracePoint, BpfError> {
        let name = self.program;
        let err = |source| BpfError::Program { name, source };
        ebpf.program_mut(name).ok_or(err(ProgramError::NotLoaded))?.try_into().map_err(err)
    }

    /// Whether the hook is attached now.
    pub(crate) const fn attached(&self) -> bool {
        self.link.is_some()
    }

    /// How many times it was attached.
    pub(crate) const fn attaches(&self) -> u64 {
        self.attaches
    }

    /// The sockets waiting, as the probes count them.
    fn pending(&self) -> Result<u64, BpfError> {
        self.slots.get(&PENDING, 0).map_err(|source| BpfError::Map { name: maps::FAILED_WRITE_WATCH, source })
    }

    fn flag(&mut self, on: bool) -> Result<(), BpfError> {
        self.slots
            .set(WATCHING, u64::from(on), 0)
            .map_err(|source| BpfError::Map { name: maps::FAILED_WRITE_WATCH, source })
    }

    /// A socket waits (a `WATCH` record): attach the hook if it is off,
    /// and keep it.
    pub(crate) fn wake(&mut self, ebpf: &mut Ebpf) -> Result<(), BpfError> {
        if self.link.is_none() {
            let name = self.program;
            let link = self.program(ebpf)?.attach().map_err(|source| BpfError::Program { name, source })?;
            self.link = Some(link);
            self.attaches += 1;
            log::debug!(
                "failed-write hook attached: a client socket reset or timed out idle waits for its application"
            );
        }
        // Only once the hook is in place: a death that reads the flag set
        // is seen.
        self.flag(true)?;
        self.phase = Phase::On { quiet_since: None };
        Ok(())
    }

    /// Once a second: attach if a socket waits (its record may have been
    /// lost), detach once none has waited for [`LINGER`].
    pub(crate) fn tend(&mut self, ebpf: &mut Ebpf, now: Instant) -> Result<(), BpfError> {
        let waiting = self.pending()? != 0;
        match self.phase {
            Phase::Off | Phase::On { .. } | Phase::Closing if waiting => self.wake(ebpf)?,
            Phase::Off => {}
            Phase::On { quiet_since: None } => self.phase = Phase::On { quiet_since: Some(now) },
            Phase::On { quiet_since: Some(t) } => {
                if now.saturating_duration_since(t) >= LINGER {
                    self.flag(false)?;
                    self.phase = Phase::Closing;
                }
            }
            Phase::Closing => {
                if let Some(id) = self.link.take() {
                    let name = self.program;
                    self.program(ebpf)?.detach(id).map_err(|source| BpfError::Program { name, source })?;
                    log::debug!("failed-write hook detached: no client socket waits on a failed write");
                }
                self.phase = Phase::Off;
            }
        }
        Ok(())
    }
}

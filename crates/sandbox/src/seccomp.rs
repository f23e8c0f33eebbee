//! The command's seccomp filter: a deny-list, kept as data ([`rules`]) so it can be reviewed,
//! tested and reported, plus [`build`] (data → BPF) and [`install`] / [`apply`] (BPF → kernel).
//!
//! Why a deny-list and not an allow-list: the command is an arbitrary program (compilers,
//! interpreters, test suites, debuggers), so anything ordinary must keep working. The namespaces,
//! the read-only host view and Landlock do the confining; this filter closes the kernel interfaces
//! that are escape or attack vectors from inside such a sandbox (mounts, modules, kexec, bpf, new
//! user namespaces, io_uring, keyrings, clock and swap control, …). `ptrace` is deliberately
//! allowed: the pid namespace already hides every host process, and debuggers inside must work.
//!
//! Every refused call gets `EPERM` (the answer a program would get without the capability), except
//! `clone3`, which gets `ENOSYS` so that libc falls back to `clone`, whose flags the filter can
//! inspect (`clone3` passes its flags in memory, out of a seccomp filter's reach).
//!
//! On x86_64 two more things are refused structurally, because a deny-list keyed on syscall
//! numbers could otherwise be bypassed: syscalls from another ABI (i386 via `int 0x80`: the
//! architecture check kills the process) and x32 syscall numbers (`__X32_SYSCALL_BIT` set:
//! `ENOSYS`).
//!
//! Owns the command's deny-list and its installation; may not decide when it is installed
//! (`stage2::confine`, last before exec), nor know the supervisor's filter (`supervisor::filter`).

use std::collections::BTreeMap;
use std::io;

use seccompiler::{sock_filter, BpfProgram, TargetArch};

/// `open_tree_attr(2)` (Linux 6.15): `open_tree` plus `mount_setattr`, not yet in `libc`.
/// Syscall numbers from 424 on are the same on every architecture.
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// When a rule refuses its syscall, by one argument (0-based index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    /// Every bit of `mask` is set in argument `arg` (all 64 bits compared).
    FlagsSet { arg: u8, mask: u64 },
    /// The low 32 bits of argument `arg` equal `value`. For arguments the kernel reads as a
    /// 32-bit `int` (an `ioctl` request): the high half is whatever the caller left in the
    /// register, so comparing all 64 bits would let `value | 1 << 32` through.
    Equals32 { arg: u8, value: u32 },
}

/// One refused syscall: what, when, with which errno, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The syscall's name, for reports and tests.
    pub syscall: &'static str,
    /// Its number on the architecture this crate is built for.
    pub nr: i64,
    /// `None`: always refused; `Some`: refused only when the argument condition holds.
    pub when: Option<Cond>,
    /// The errno the caller sees.
    pub errno: i32,
    /// One line saying why it is refused.
    pub reason: &'static str,
}

const fn deny(syscall: &'static str, nr: i64, reason: &'static str) -> Rule {
    Rule { syscall, nr, when: None, errno: libc::EPERM, reason }
}

/// `clone`'s and `unshare`'s flags are argument 0 on every supported architecture.
const NEWUSER_IN_ARG0: Cond = Cond::FlagsSet { arg: 0, mask: libc::CLONE_NEWUSER as u64 };

/// An `ioctl` refused by its request number (argument 1).
const fn deny_ioctl(request: u64, reason: &'static str) -> Rule {
    // Request numbers are 32-bit (`unsigned int` in the kernel).
    Rule {
        syscall: "ioctl",
        nr: libc::SYS_ioctl,
        when: Some(Cond::Equals32 { arg: 1, value: request as u32 }),
        errno: libc::EPERM,
        reason,
    }
}

#[rustfmt::skip]
const RULES: &[Rule] = &[
    // Mounts: the mount plan is built before the command starts and must stay as it is.
    deny("mount", libc::SYS_mount, "changing the mount table could uncover hidden or read-only paths"),
    deny("umount2", libc::SYS_umount2, "unmounting the overlay or a hiding tmpfs would uncover the host"),
    deny("pivot_root", libc::SYS_pivot_root, "changing the root could escape the mount plan"),
    deny("fsopen", libc::SYS_fsopen, "new mount API: creating a filesystem context"),
    deny("fsconfig", libc::SYS_fsconfig, "new mount API: configuring a filesystem context"),
    deny("fsmount", libc::SYS_fsmount, "new mount API: creating a mount"),
    deny("fspick", libc::SYS_fspick, "new mount API: reconfiguring an existing mount"),
    deny("move_mount", libc::SYS_move_mount, "new mount API: attaching or moving a mount"),
    deny("open_tree", libc::SYS_open_tree, "a cloned mount tree shows what the sandbox's mounts hide"),
    deny("open_tree_attr", SYS_OPEN_TREE_ATTR, "open_tree with attribute changes, same risk as open_tree"),
    deny("mount_setattr", libc::SYS_mount_setattr, "could make read-only mounts writable"),
    // The kernel itself.
    deny("kexec_load", libc::SYS_kexec_load, "loads a new kernel"),
    deny("kexec_file_load", libc::SYS_kexec_file_load, "loads a new kernel"),
    deny("init_module", libc::SYS_init_module, "loads kernel code"),
    deny("finit_module", libc::SYS_finit_module, "loads kernel code"),
    deny("delete_module", libc::SYS_delete_module, "unloads kernel code"),
    deny("bpf", libc::SYS_bpf, "eBPF is a large kernel attack surface and can observe the host"),
    deny("perf_event_open", libc::SYS_perf_event_open, "observes the host; a frequent exploit vector"),
    deny("userfaultfd", libc::SYS_userfaultfd, "a classic tool for winning kernel race conditions"),
    deny("io_uring_setup", libc::SYS_io_uring_setup, "io_uring bypasses the syscall filter; large attack surface"),
    deny("io_uring_enter", libc::SYS_io_uring_enter, "io_uring bypasses the syscall filter"),
    deny("io_uring_register", libc::SYS_io_uring_register, "io_uring bypasses the syscall filter"),
    // Keyrings are not namespaced: the host's keys (credentials, tokens) live there.
    deny("keyctl", libc::SYS_keyctl, "kernel keyrings are shared with the host"),
    deny("add_key", libc::SYS_add_key, "kernel keyrings are shared with the host"),
    deny("request_key", libc::SYS_request_key, "kernel keyrings are shared with the host"),
    // Namespaces.
    deny("setns", libc::SYS_setns, "joining another namespace leaves the sandbox"),
    Rule {
        syscall: "unshare",
        nr: libc::SYS_unshare,
        when: Some(NEWUSER_IN_ARG0),
        errno: libc::EPERM,
        reason: "a new user namespace grants capabilities that reopen the kernel's attack surface",
    },
    Rule {
        syscall: "clone",
        nr: libc::SYS_clone,
        when: Some(NEWUSER_IN_ARG0),
        errno: libc::EPERM,
        reason: "a new user namespace grants capabilities that reopen the kernel's attack surface",
    },
    Rule {
        syscall: "clone3",
        nr: libc::SYS_clone3,
        when: None,
        errno: libc::ENOSYS,
        reason: "its flags are out of the filter's reach; ENOSYS makes libc fall back to clone",
    },
    // Host files and devices reached around the mount plan.
    deny("open_by_handle_at", libc::SYS_open_by_handle_at, "opens files by handle, bypassing the mount plan"),
    deny("swapon", libc::SYS_swapon, "host swap configuration"),
    deny("swapoff", libc::SYS_swapoff, "host swap configuration"),
    deny("acct", libc::SYS_acct, "host process accounting"),
    deny("quotactl", libc::SYS_quotactl, "host disk quotas"),
    deny("quotactl_fd", libc::SYS_quotactl_fd, "host disk quotas"),
    deny("lookup_dcookie", libc::SYS_lookup_dcookie, "kernel profiling interface, exposes host paths"),
    deny("vhangup", libc::SYS_vhangup, "hangs up the controlling terminal, which is the user's"),
    // Terminals: the command has a terminal of its own (a pseudo-terminal txbox relays), but a
    // descriptor of the caller's may still reach it; pushing input into a terminal is how a
    // command gets the caller's shell to run something after txbox returns.
    deny_ioctl(libc::TIOCSTI, "TIOCSTI pushes input into a terminal, which a shell outside then runs"),
    deny_ioctl(libc::TIOCLINUX, "TIOCLINUX pastes the console selection as input, among other console controls"),
    deny("syslog", libc::SYS_syslog, "the kernel log belongs to the host"),
    // Host-wide state.
    deny("reboot", libc::SYS_reboot, "reboots or halts the host"),
    deny("settimeofday", libc::SYS_settimeofday, "sets the host clock"),
    deny("clock_settime", libc::SYS_clock_settime, "sets the host clock"),
    deny("clock_adjtime", libc::SYS_clock_adjtime, "adjusts the host clock"),
    deny("adjtimex", libc::SYS_adjtimex, "adjusts the host clock"),
    #[cfg(target_arch = "x86_64")]
    deny("iopl", libc::SYS_iopl, "raw access to host I/O ports"),
    #[cfg(target_arch = "x86_64")]
    deny("ioperm", libc::SYS_ioperm, "raw access to host I/O ports"),
];

/// The refused syscalls for the architecture this crate is built for. Everything else is
/// allowed.
pub fn rules() -> &'static [Rule] {
    RULES
}

/// A step of building or installing the filter failed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: unsupported architecture {0} (txbox supports x86_64 and aarch64)")]
    UnsupportedArch(&'static str),
    #[error("seccomp: the filter's jump at instruction {0} does not reach its target")]
    BadJump(usize),
    #[error("seccomp: the filter has {0} instructions, more than the kernel's limit of 4096")]
    TooLarge(usize),
    #[error("seccomp: prctl(PR_SET_NO_NEW_PRIVS): {0}")]
    NoNewPrivs(io::Error),
    #[error("seccomp: installing the filter: {0}")]
    Install(seccompiler::Error),
}

// Classic BPF opcodes (linux/bpf_common.h); `seccompiler` keeps its own private.
/// `BPF_LD | BPF_W | BPF_ABS`: load a 32-bit word of `seccomp_data`.
const BPF_LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JA`: unconditional forward jump by `k`.
const BPF_JMP_JA: u16 = 0x05;
/// `BPF_JMP | BPF_JGE | BPF_K`.
const BPF_JMP_JGE_K: u16 = 0x35;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const BPF_JMP_JEQ_K: u16 = 0x15;
/// `BPF_ALU | BPF_AND | BPF_K`: `A &= k`.
const BPF_ALU_AND_K: u16 = 0x54;
/// `BPF_RET | BPF_K`: return the action `k`.
const BPF_RET_K: u16 = 0x06;
/// Offset of `nr` in `struct seccomp_data`.
const SECCOMP_DATA_NR: u32 = 0;
/// Offset of `arch` in `struct seccomp_data`.
const SECCOMP_DATA_ARCH: u32 = 4;
/// x32 syscalls carry this bit in their number (x86_64).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// The kernel's `BPF_MAXINSNS`.
const BPF_MAX_LEN: usize = 4096;

const fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Compiles [`rules`] into one BPF program for the running architecture: each matched rule
/// answers its errno, everything else is allowed.
pub fn build() -> Result<BpfProgram, SeccompError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompError::UnsupportedArch(std::env::consts::ARCH))?;
    compile(arch, RULES)
}

/// How many syscall numbers a leaf of the search compares one by one.
const LEAF: usize = 4;

/// The decision tree for `rules` on `arch`, as one program:
///
/// 1. another architecture's syscalls (i386 through `int 0x80`) kill the process; on x86_64,
///    a number with `__X32_SYSCALL_BIT` gets `ENOSYS`;
/// 2. a binary search over the numbers some rule names, down to leaves of [`LEAF`] numbers: a
///    syscall no rule names is allowed after at most ~16 instructions;
/// 3. a named number jumps to its rules' answer: the errno at once when a rule is
///    unconditional, else its conditions on the arguments, in table order, then "allow".
///
/// Why not `seccompiler`'s compiler: it gives a filter a single match action and a block per
/// rule that loads the number and the architecture again; the chain of its programs, one per
/// errno, behind a search was 376 instructions, this is 99. The kernel's work when a filter is
/// attached (checking it, converting it to eBPF, JIT-compiling it, and running it for every
/// syscall number to fill its cache) grows with its length, and every command pays it before
/// exec (#18): ~100 µs of the command's start, now ~60. The program decides exactly as that
/// chain did: the tests compare both on every number and on the arguments each rule looks at.
fn compile(arch: TargetArch, rules: &[Rule]) -> Result<BpfProgram, SeccompError> {
    // The table's errnos in the order they first appear: it decides between rules of one
    // number with different errnos.
    let mut errnos: Vec<i32> = Vec::new();
    for r in rules {
        if !errnos.contains(&r.errno) {
            errnos.push(r.errno);
        }
    }
    let mut a = Asm::default();
    let (native, kill) = (a.label(), a.label());
    let mut answers = Answers::default();
    let x86 = arch == TargetArch::x86_64;
    a.op(stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH));
    a.jump(BPF_JMP_JEQ_K, audit_arch(arch), Some(native), Some(kill));
    a.place(native);
    a.op(stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR));
    if x86 {
        // x32 syscalls share x86_64's audit architecture but carry this bit in their number, so
        // `mount` could be reached as `0x40000000 | 165`: none is allowed (x32 programs are not
        // supported in the sandbox).
        let enosys = answers.errno(&mut a, libc::ENOSYS);
        a.jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, Some(enosys), None);
    }
    // Each named number and where its decision is; rules of one number in table order.
    let mut named: BTreeMap<u32, Vec<&Rule>> = BTreeMap::new();
    for r in rules {
        if let Ok(nr) = u32::try_from(r.nr) {
            named.entry(nr).or_default().push(r);
        }
    }
    let mut targets: Vec<(u32, Label)> = Vec::with_capacity(named.len());
    let mut blocks: Vec<(Label, &[&Rule])> = Vec::new();
    for (nr, rs) in &named {
        // Refused whatever the arguments: straight to the answer.
        let to = match rs.first() {
            Some(r) if r.when.is_none() => answers.errno(&mut a, r.errno),
            _ => {
                let l = a.label();
                blocks.push((l, rs.as_slice()));
                l
            }
        };
        targets.push((*nr, to));
    }
    search(&mut a, &targets);
    for (l, rs) in blocks {
        a.place(l);
        decide(&mut a, &mut answers, &errnos, rs);
    }
    // Another architecture: on x86_64 an x32-tagged number still answers ENOSYS, as the
    // number check would have had the architecture matched.
    a.place(kill);
    if x86 {
        let enosys = answers.errno(&mut a, libc::ENOSYS);
        a.op(stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR));
        a.jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, Some(enosys), None);
    }
    a.op(stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS));
    answers.place(&mut a);
    let program = a.finish()?;
    if program.len() > BPF_MAX_LEN {
        return Err(SeccompError::TooLarge(program.len()));
    }
    Ok(program)
}

/// The binary search over `targets` (sorted by number), with the number loaded: compare with a
/// pivot and go on in one half, down to leaves that compare each number and allow the rest.
fn search(a: &mut Asm, targets: &[(u32, Label)]) {
    if targets.len() <= LEAF {
        for (nr, to) in targets {
            a.jump(BPF_JMP_JEQ_K, *nr, Some(*to), None);
        }
        a.op(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
        return;
    }
    let (low, high) = targets.split_at(targets.len() / 2);
    let upper = a.label();
    let pivot = high.first().map_or(u32::MAX, |t| t.0);
    a.jump(BPF_JMP_JGE_K, pivot, Some(upper), None);
    search(a, low);
    a.place(upper);
    search(a, high);
}

/// The rules of one number, none unconditional first: each condition in table order jumps to
/// its errno when it holds; a later unconditional rule answers at once; else "allow".
///
/// `errnos` (the table's, in the order they first appear) decides between rules of one number
/// with different errnos, as the chained programs of each errno did.
fn decide(a: &mut Asm, answers: &mut Answers, errnos: &[i32], rules: &[&Rule]) {
    for &errno in errnos {
        let of_errno = || rules.iter().filter(move |r| r.errno == errno);
        if of_errno().any(|r| r.when.is_none()) {
            let to = answers.errno(a, errno);
            a.op_jump(to);
            return;
        }
        for r in of_errno() {
            if let Some(cond) = r.when {
                let to = answers.errno(a, errno);
                test(a, cond, to);
            }
        }
    }
    a.op(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
}

/// Jump to `to` when `cond` holds; go on with the next instruction when it does not.
fn test(a: &mut Asm, cond: Cond, to: Label) {
    // `seccomp_data.args[i]` is a u64 at 16 + 8i; its low word first (little-endian: every
    // architecture this crate supports).
    let low = |arg: u8| 16 + 8 * u32::from(arg);
    match cond {
        Cond::Equals32 { arg, value } => {
            a.op(stmt(BPF_LD_W_ABS, low(arg)));
            a.jump(BPF_JMP_JEQ_K, value, Some(to), None);
        }
        Cond::FlagsSet { arg, mask } => {
            // Every bit of the mask set, in both words that have any: the high word first.
            let words: Vec<(u32, u32)> = [(low(arg) + 4, (mask >> 32) as u32), (low(arg), mask as u32)]
                .into_iter()
                .filter(|(_, m)| *m != 0)
                .collect();
            let fails = a.label();
            for (i, (offset, m)) in words.iter().enumerate() {
                a.op(stmt(BPF_LD_W_ABS, *offset));
                a.op(stmt(BPF_ALU_AND_K, *m));
                let last = i + 1 == words.len();
                a.jump(BPF_JMP_JEQ_K, *m, last.then_some(to), Some(fails));
            }
            if words.is_empty() {
                // A mask of no bits is set in every argument.
                a.op_jump(to);
            }
            a.place(fails);
        }
    }
}

const _: () = assert!(cfg!(target_endian = "little"), "seccomp_data's argument words are read little-endian");

/// The returns the program's jumps lead to, one per errno, placed at its end.
#[derive(Default)]
struct Answers {
    errnos: Vec<(i32, Label)>,
}

impl Answers {
    /// The label of the instruction that answers `errno`.
    fn errno(&mut self, a: &mut Asm, errno: i32) -> Label {
        if let Some((_, l)) = self.errnos.iter().find(|(e, _)| *e == errno) {
            return *l;
        }
        let l = a.label();
        self.errnos.push((errno, l));
        l
    }

    fn place(self, a: &mut Asm) {
        for (errno, l) in self.errnos {
            a.place(l);
            // errno is a small positive constant from libc.
            a.op(stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | errno.unsigned_abs()));
        }
    }
}

/// A place in a program being assembled, known by name until [`Asm::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label(usize);

/// One instruction of a program being assembled.
enum Ins {
    Op(sock_filter),
    /// A conditional jump comparing the accumulator with `k`: to `yes` when it holds, else to
    /// `no` (`None`: the next instruction).
    Jump {
        code: u16,
        k: u32,
        yes: Option<Label>,
        no: Option<Label>,
    },
    /// An unconditional jump.
    Always(Label),
    /// A label: it names the next instruction.
    Here(Label),
}

/// An assembler of classic BPF with forward jumps to labels.
#[derive(Default)]
struct Asm {
    ins: Vec<Ins>,
    labels: usize,
}

impl Asm {
    fn label(&mut self) -> Label {
        self.labels += 1;
        Label(self.labels - 1)
    }

    fn op(&mut self, f: sock_filter) {
        self.ins.push(Ins::Op(f));
    }

    fn jump(&mut self, code: u16, k: u32, yes: Option<Label>, no: Option<Label>) {
        self.ins.push(Ins::Jump { code, k, yes, no });
    }

    fn op_jump(&mut self, to: Label) {
        self.ins.push(Ins::Always(to));
    }

    fn place(&mut self, l: Label) {
        self.ins.push(Ins::Here(l));
    }

    /// The program, each label resolved to the instruction after it. Jumps go forward only
    /// (classic BPF has no other), a conditional one at most 255 instructions.
    fn finish(self) -> Result<BpfProgram, SeccompError> {
        let mut at = vec![None; self.labels];
        let mut pc = 0usize;
        for i in &self.ins {
            match i {
                Ins::Here(Label(l)) => at[*l] = Some(pc),
                _ => pc += 1,
            }
        }
        let mut program = Vec::with_capacity(pc);
        for i in self.ins {
            let pc = program.len();
            // The offset of a jump at `pc` to `l`: from the instruction after it.
            let offset = |l: Option<Label>| -> Result<usize, SeccompError> {
                match l {
                    None => Ok(0),
                    Some(Label(l)) => match at.get(l).copied().flatten() {
                        Some(to) if to > pc => Ok(to - pc - 1),
                        _ => Err(SeccompError::BadJump(pc)),
                    },
                }
            };
            let short = |o: usize| u8::try_from(o).map_err(|_| SeccompError::BadJump(pc));
            match i {
                Ins::Here(_) => continue,
                Ins::Op(f) => program.push(f),
                Ins::Jump { code, k, yes, no } => {
                    program.push(jump(code, k, short(offset(yes)?)?, short(offset(no)?)?));
                }
                Ins::Always(to) => {
                    let o = u32::try_from(offset(Some(to))?).map_err(|_| SeccompError::BadJump(pc))?;
                    program.push(stmt(BPF_JMP_JA, o));
                }
            }
        }
        Ok(program)
    }
}

/// `AUDIT_ARCH_*` (linux/audit.h) of `arch`: what `seccomp_data.arch` holds for its syscalls.
/// (`seccompiler` has it, privately.) Were it wrong, every syscall would kill the process:
/// `filter_refuses_escapes_in_a_forked_child` would fail.
fn audit_arch(arch: TargetArch) -> u32 {
    const LE_64BIT: u32 = 0x8000_0000 | 0x4000_0000;
    match arch {
        TargetArch::x86_64 => 62 | LE_64BIT,
        TargetArch::aarch64 => 183 | LE_64BIT,
        TargetArch::riscv64 => 243 | LE_64BIT,
    }
}

/// Sets `PR_SET_NO_NEW_PRIVS` (required to install a filter without `CAP_SYS_ADMIN`, and so that
/// no setuid program can shed the filter) and installs `program` on the calling thread.
///
/// Does not allocate, so it may be called in a child forked from a multi-threaded process.
pub fn install(program: &BpfProgram) -> Result<(), SeccompError> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes no pointers and only sets a flag on
    // the calling thread.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(SeccompError::NoNewPrivs(io::Error::last_os_error()));
    }
    seccompiler::apply_filter(program).map_err(SeccompError::Install)
}

/// Builds the filter and installs it on the calling thread. Called in the forked command process
/// right before `execve` (single-threaded), after Landlock. The filter survives `execve` and is
/// inherited by every descendant.
pub fn apply() -> Result<(), SeccompError> {
    install(&build()?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod oracle;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const EXPECTED: &[&str] = &[
        "mount",
        "umount2",
        "pivot_root",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "move_mount",
        "open_tree",
        "mount_setattr",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "bpf",
        "perf_event_open",
        "keyctl",
        "add_key",
        "request_key",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "setns",
        "unshare",
        "clone",
        "clone3",
        "userfaultfd",
        "open_by_handle_at",
        "swapon",
        "swapoff",
        "reboot",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "acct",
        "quotactl",
        "lookup_dcookie",
        "vhangup",
        "syslog",
        "ioctl",
    ];

    fn rule(name: &str) -> Rule {
        match rules().iter().find(|r| r.syscall == name) {
            Some(r) => *r,
            None => panic!("no rule for {name}"),
        }
    }

    #[test]
    fn table_lists_every_refused_syscall() {
        for name in EXPECTED {
            let r = rule(name);
            assert!(!r.reason.is_empty(), "{name} has no reason");
        }
        for name in ["unshare", "clone"] {
            let r = rule(name);
            assert_eq!(r.errno, libc::EPERM);
            assert_eq!(r.when, Some(Cond::FlagsSet { arg: 0, mask: libc::CLONE_NEWUSER as u64 }), "{name}");
        }
        assert_eq!(rule("clone3").errno, libc::ENOSYS);
        assert_eq!(rule("mount").nr, libc::SYS_mount);
        let ioctls: Vec<Option<Cond>> = rules().iter().filter(|r| r.syscall == "ioctl").map(|r| r.when).collect();
        assert_eq!(
            ioctls,
            [
                Some(Cond::Equals32 { arg: 1, value: libc::TIOCSTI as u32 }),
                Some(Cond::Equals32 { arg: 1, value: libc::TIOCLINUX as u32 })
            ]
        );
        for r in rules().iter().filter(|r| !["unshare", "clone", "ioctl"].contains(&r.syscall)) {
            assert_eq!(r.when, None, "{} should be unconditional", r.syscall);
            if r.syscall != "clone3" {
                assert_eq!(r.errno, libc::EPERM, "{}", r.syscall);
            }
        }
        for name in ["ptrace", "personality", "getpid"] {
            assert!(rules().iter().all(|r| r.syscall != name), "{name} must stay allowed");
        }
    }

    #[test]
    fn table_has_no_duplicates() {
        // A syscall refused under several conditions (ioctl) has one rule per condition.
        let mut nrs: Vec<i64> = rules().iter().filter(|r| r.syscall != "ioctl").map(|r| r.nr).collect();
        nrs.sort_unstable();
        let n = nrs.len();
        nrs.dedup();
        assert_eq!(nrs.len(), n, "a syscall number appears twice");
    }

    fn native() -> TargetArch {
        TargetArch::try_from(std::env::consts::ARCH).unwrap()
    }

    #[test]
    fn build_succeeds_and_is_short() {
        let prog = build().unwrap();
        // What attaching the filter costs every command grows with its length (`compile`).
        assert!(!prog.is_empty() && prog.len() <= 128, "{} instructions", prog.len());
        let mut named: Vec<i64> = rules().iter().map(|r| r.nr).collect();
        named.sort_unstable();
        named.dedup();
        assert!(prog.len() <= 2 * named.len() + 20, "{} instructions for {} numbers", prog.len(), named.len());
        assert!(prog.len() * 2 < oracle::chain(native(), rules()).len());
    }

    /// `struct seccomp_data` as a filter sees it.
    #[derive(Debug, Clone, Copy)]
    struct Data {
        nr: u32,
        arch: u32,
        args: [u64; 6],
    }

    /// A classic BPF interpreter for the instructions our filters use: what the kernel would
    /// return, and how many instructions it ran.
    fn run(prog: &[sock_filter], d: &Data) -> (u32, usize) {
        let (mut a, mut pc, mut steps) = (0u32, 0usize, 0usize);
        loop {
            let Some(i) = prog.get(pc) else { panic!("ran off the end at {pc}") };
            steps += 1;
            pc += 1;
            match i.code {
                BPF_LD_W_ABS => {
                    a = match i.k {
                        0 => d.nr,
                        4 => d.arch,
                        k @ 16..=63 if k % 4 == 0 => {
                            let arg = d.args[((k - 16) / 8) as usize];
                            if (k - 16) % 8 == 0 {
                                arg as u32
                            } else {
                                (arg >> 32) as u32
                            }
                        }
                        k => panic!("load of offset {k}"),
                    }
                }
                // BPF_ALU | BPF_AND | BPF_K
                0x54 => a &= i.k,
                BPF_JMP_JA => pc += i.k as usize,
                BPF_JMP_JEQ_K | BPF_JMP_JGE_K | 0x25 | 0x45 => {
                    let taken = match i.code {
                        BPF_JMP_JEQ_K => a == i.k,
                        BPF_JMP_JGE_K => a >= i.k,
                        0x25 => a > i.k,
                        _ => a & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                BPF_RET_K => return (i.k, steps),
                code => panic!("instruction {code:#x} at {}", pc - 1),
            }
        }
    }

    /// The syscalls to try: every number up to past the highest, x32 numbers, and numbers no
    /// table could name; with the arguments every rule compares, and their neighbours.
    fn inputs(arch: u32) -> Vec<Data> {
        let mut nrs: Vec<u32> = (0..600).collect();
        nrs.extend(rules().iter().map(|r| X32_SYSCALL_BIT | r.nr as u32));
        nrs.extend([X32_SYSCALL_BIT, X32_SYSCALL_BIT - 1, u32::MAX, 0x8000_0000]);
        let mut args: Vec<u64> = vec![0, u64::MAX, 1 << 32];
        for r in rules() {
            match r.when {
                Some(Cond::FlagsSet { mask, .. }) => args.extend([mask, mask | 1, mask - 1, !mask]),
                Some(Cond::Equals32 { value, .. }) => {
                    let v = u64::from(value);
                    args.extend([v, v | 1 << 32, v + 1, v - 1]);
                }
                None => {}
            }
        }
        let mut out = Vec::new();
        for nr in nrs {
            for a in &args {
                out.push(Data { nr, arch, args: [*a; 6] });
                out.push(Data { nr, arch, args: [0, *a, 0, 0, 0, 0] });
            }
        }
        out
    }

    /// Every instruction's jumps land inside the program, forward.
    fn well_formed(prog: &[sock_filter]) {
        for (pc, i) in prog.iter().enumerate() {
            let targets: Vec<usize> = match i.code {
                BPF_JMP_JA => vec![pc + 1 + i.k as usize],
                BPF_JMP_JEQ_K | BPF_JMP_JGE_K | 0x25 | 0x45 => {
                    vec![pc + 1 + usize::from(i.jt), pc + 1 + usize::from(i.jf)]
                }
                _ => vec![],
            };
            assert!(targets.iter().all(|t| *t < prog.len()), "jump out of the program at {pc}");
        }
        assert_eq!(prog.last().map(|i| i.code), Some(BPF_RET_K), "the program may run off its end");
    }

    #[test]
    fn compiled_decides_as_seccompiler_would() {
        let prog = build().unwrap();
        well_formed(&prog);
        let oracle = oracle::chain(native(), rules());
        // Native, i386 (`int 0x80`), and an architecture no filter knows.
        for arch in [audit_arch(native()), 0x4000_0003, 0] {
            for d in inputs(arch) {
                assert_eq!(run(&prog, &d).0, run(&oracle, &d).0, "{d:?}");
            }
        }
    }

    /// Tables of other shapes than txbox's: a number refused under several errnos, an
    /// unconditional rule after conditional ones, masks in the high word and of no bits.
    #[test]
    fn compiled_decides_as_seccompiler_would_for_other_tables() {
        let r = |nr: i64, when: Option<Cond>, errno: i32| Rule { syscall: "x", nr, when, errno, reason: "test" };
        let tables: Vec<Vec<Rule>> = vec![
            vec![r(7, Some(Cond::Equals32 { arg: 2, value: 9 }), libc::EPERM), r(7, None, libc::ENOSYS)],
            vec![r(7, None, libc::EACCES), r(7, Some(Cond::FlagsSet { arg: 0, mask: 1 << 40 | 3 }), libc::EPERM)],
            vec![
                r(3, Some(Cond::FlagsSet { arg: 5, mask: 1 << 63 }), libc::EPERM),
                r(3, Some(Cond::FlagsSet { arg: 1, mask: 0 }), libc::ENOSYS),
            ],
            (0..40).map(|n| r(n * 7, None, libc::EPERM)).collect(),
            rules().iter().rev().copied().collect(),
        ];
        for table in tables {
            let prog = compile(native(), &table).unwrap();
            well_formed(&prog);
            let oracle = oracle::chain(native(), &table);
            let mut args: Vec<u64> = vec![0, 1, 2, 3, 9, 9 | 1 << 32, 1 << 40, 1 << 40 | 3, 1 << 63, u64::MAX];
            args.extend(inputs(0).iter().map(|d| d.args[1]).take(40));
            for arch in [audit_arch(native()), 0x4000_0003] {
                for nr in (0..300).chain([X32_SYSCALL_BIT | 7, u32::MAX]) {
                    for a in &args {
                        for d in [Data { nr, arch, args: [*a; 6] }, Data { nr, arch, args: [0, *a, *a, 0, 0, *a] }] {
                            assert_eq!(run(&prog, &d).0, run(&oracle, &d).0, "{table:?} {d:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn unnamed_syscalls_are_allowed_at_once() {
        let prog = build().unwrap();
        let named: Vec<u32> = rules().iter().map(|r| r.nr as u32).collect();
        let mut allowed = 0;
        for nr in (0..600).filter(|nr| !named.contains(nr)) {
            let (ret, steps) = run(&prog, &Data { nr, arch: audit_arch(native()), args: [0; 6] });
            assert_eq!(ret, libc::SECCOMP_RET_ALLOW, "{nr}");
            assert!(steps <= 16, "syscall {nr} ran {steps} instructions");
            allowed += 1;
        }
        assert!(allowed > 500);
    }

    /// What each probe returned: 0 on success, `-errno` on failure.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Probes {
        getpid: i64,
        mount: i64,
        setns: i64,
        clone3: i64,
        x32_getpid: i64,
        unshare_fs: i64,
        unshare_newns: i64,
        clone_newuser: i64,
        unshare_newuser: i64,
        tiocsti: i64,
        tiocsti_high_bits: i64,
        tiocgwinsz: i64,
    }
    const N: usize = 12;
    const INSTALL_FAILED: i64 = i64::MIN;

    /// Forks a child that (optionally) installs `filter` and runs the probes, reporting them
    /// through a pipe. The child only makes async-signal-safe calls: this process has threads.
    fn probe(filter: Option<&BpfProgram>) -> Probes {
        let mut fds = [0i32; 2];
        // SAFETY: fds is a valid array of two ints for pipe2 to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the child below only calls async-signal-safe functions (prctl, seccomp,
        // syscall, write, waitpid, _exit) and never returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            child(filter, fds[1]);
        }
        // SAFETY: closing our copy of the write end, which we own.
        unsafe { libc::close(fds[1]) };
        let mut buf = [0u8; N * 8];
        let mut got = 0;
        while got < buf.len() {
            // SAFETY: reading into the unfilled tail of buf, within its bounds.
            let n = unsafe { libc::read(fds[0], buf[got..].as_mut_ptr().cast(), buf.len() - got) };
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        let mut status = 0;
        // SAFETY: reaping the child we forked; status is a valid out pointer.
        unsafe {
            libc::close(fds[0]);
            libc::waitpid(pid, &mut status, 0);
        }
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
        assert_eq!(got, buf.len(), "short report from the child");
        let v: Vec<i64> = buf.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect();
        assert!(v.iter().all(|&x| x != INSTALL_FAILED), "installing the filter failed in the child");
        Probes {
            getpid: v[0],
            mount: v[1],
            setns: v[2],
            clone3: v[3],
            x32_getpid: v[4],
            unshare_fs: v[5],
            unshare_newns: v[6],
            clone_newuser: v[7],
            unshare_newuser: v[8],
            tiocsti: v[9],
            tiocsti_high_bits: v[10],
            tiocgwinsz: v[11],
        }
    }

    /// The forked child's body: async-signal-safe calls only. Never returns.
    fn child(filter: Option<&BpfProgram>, out: i32) -> ! {
        fn result(rc: libc::c_long) -> i64 {
            if rc < 0 {
                // SAFETY: errno is thread-local and readable at any time.
                -i64::from(unsafe { *libc::__errno_location() })
            } else {
                0
            }
        }
        let mut r = [0i64; N];
        let installed = match filter {
            Some(f) => install(f).is_ok(),
            None => true,
        };
        if !installed {
            r = [INSTALL_FAILED; N];
        } else {
            // SAFETY: raw syscalls with integer arguments, valid C strings, or null
            // pointers the kernel rejects; none touches memory Rust relies on.
            unsafe {
                r[0] = result(libc::syscall(libc::SYS_getpid));
                // A target that does not exist: without the filter the kernel answers ENOENT
                // (path lookup precedes the permission check), so EPERM proves the filter.
                r[1] = result(libc::syscall(
                    libc::SYS_mount,
                    c"none".as_ptr(),
                    c"/nonexistent/txbox-seccomp-test".as_ptr(),
                    c"tmpfs".as_ptr(),
                    0 as libc::c_ulong,
                    std::ptr::null::<libc::c_void>(),
                ));
                // Without the filter: EBADF.
                r[2] = result(libc::syscall(libc::SYS_setns, -1 as libc::c_int, 0 as libc::c_int));
                // Without the filter: EINVAL (null args, size 0).
                r[3] = result(libc::syscall(libc::SYS_clone3, std::ptr::null::<libc::c_void>(), 0 as libc::size_t));
                r[4] = result(libc::syscall(0x4000_0000 | libc::SYS_getpid));
                r[5] = result(libc::c_long::from(libc::unshare(libc::CLONE_FS)));
                r[6] = result(libc::c_long::from(libc::unshare(libc::CLONE_NEWNS)));
                // Fork-like clone (no stack): if it ever succeeds, the new child leaves at once.
                let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
                let rc = libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize);
                if rc == 0 {
                    libc::_exit(0);
                }
                if rc > 0 {
                    libc::waitpid(rc as libc::pid_t, std::ptr::null_mut(), 0);
                }
                r[7] = result(rc);
                // On fd -1: without the filter EBADF. The request number with garbage in the
                // high half of the register is the same request to the kernel.
                let sti = libc::TIOCSTI as libc::c_ulong;
                r[9] = result(libc::syscall(libc::SYS_ioctl, -1 as libc::c_int, sti, 0usize));
                r[10] = result(libc::syscall(libc::SYS_ioctl, -1 as libc::c_int, sti | (1 << 32), 0usize));
                r[11] = result(libc::syscall(
                    libc::SYS_ioctl,
                    -1 as libc::c_int,
                    libc::TIOCGWINSZ as libc::c_ulong,
                    0usize,
                ));
                // Last: success would move this child into a new user namespace.
                r[8] = result(libc::c_long::from(libc::unshare(libc::CLONE_NEWUSER)));
            }
        }
        // SAFETY: writing the fixed-size result array to the pipe, then leaving without running
        // any of the parent's destructors or atexit handlers.
        unsafe {
            libc::write(out, r.as_ptr().cast(), std::mem::size_of_val(&r));
            libc::_exit(0)
        }
    }

    #[test]
    fn filter_refuses_escapes_in_a_forked_child() {
        // Everything that allocates happens before fork.
        let prog = build().unwrap();
        let base = probe(None);
        let got = probe(Some(&prog));
        eprintln!("without filter: {base:?}\nwith filter:    {got:?}");

        let eperm = -i64::from(libc::EPERM);
        assert_eq!(got.getpid, 0, "ordinary syscalls work");
        assert_eq!(got.mount, eperm);
        assert_ne!(base.mount, eperm, "without the filter mount fails otherwise (ENOENT)");
        assert_eq!(got.setns, eperm);
        assert_eq!(got.clone3, -i64::from(libc::ENOSYS));
        assert_eq!(got.unshare_newuser, eperm);
        assert_eq!(got.clone_newuser, eperm);
        // Other namespace flags are not the filter's business.
        assert_eq!(got.unshare_fs, 0);
        assert_eq!(got.unshare_newns, base.unshare_newns);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(got.x32_getpid, -i64::from(libc::ENOSYS));
        }
        let ebadf = -i64::from(libc::EBADF);
        assert_eq!((base.tiocsti, base.tiocsti_high_bits), (ebadf, ebadf));
        assert_eq!((got.tiocsti, got.tiocsti_high_bits), (eperm, eperm), "TIOCSTI is refused however it is encoded");
        assert_eq!(got.tiocgwinsz, ebadf, "other terminal requests are not the filter's business");
    }
}

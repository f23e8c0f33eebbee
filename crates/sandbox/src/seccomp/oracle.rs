//! The filter as `seccompiler` compiles the same table (how txbox built it before #18's compact
//! compiler): one program per errno, chained, behind an x32 guard. Tests only: an independent
//! implementation the compiled program must decide exactly like.

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::{stmt, Cond, Rule, BPF_JMP_JA, BPF_JMP_JGE_K, BPF_LD_W_ABS, BPF_RET_K, SECCOMP_DATA_NR, X32_SYSCALL_BIT};

/// The rules' programs, chained: the x32 guard, then one program per errno.
pub(super) fn chain(arch: TargetArch, rules: &[Rule]) -> BpfProgram {
    let mut errnos: Vec<i32> = Vec::new();
    for r in rules {
        if !errnos.contains(&r.errno) {
            errnos.push(r.errno);
        }
    }
    let mut program = x32_guard(arch);
    let groups = errnos.len();
    for (i, errno) in errnos.into_iter().enumerate() {
        let mut part = compile_group(arch, rules, errno);
        if i + 1 < groups {
            chain_to_next(&mut part);
        }
        program.append(&mut part);
    }
    program
}

/// The rules answering `errno`, compiled by `seccompiler` (which also prepends the architecture
/// check that kills a process making syscalls of another ABI).
fn compile_group(arch: TargetArch, rules: &[Rule], errno: i32) -> BpfProgram {
    let group: Vec<&Rule> = rules.iter().filter(|r| r.errno == errno).collect();
    // An empty chain matches unconditionally, so an unconditional rule wins over conditional
    // ones for the same syscall.
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for r in group.iter().filter(|r| r.when.is_none()) {
        map.insert(r.nr, Vec::new());
    }
    for r in &group {
        let Some(when) = r.when else {
            continue;
        };
        if map.get(&r.nr).is_some_and(Vec::is_empty) {
            continue;
        }
        let cond = match when {
            Cond::FlagsSet { arg, mask } => {
                SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(mask), mask)
            }
            Cond::Equals32 { arg, value } => {
                SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, u64::from(value))
            }
        }
        .expect("condition");
        map.entry(r.nr).or_default().push(SeccompRule::new(vec![cond]).expect("rule"));
    }
    let action = SeccompAction::Errno(errno.unsigned_abs());
    let filter = SeccompFilter::new(map, SeccompAction::Allow, action, arch).expect("filter");
    BpfProgram::try_from(filter).expect("program")
}

/// Rewrites every "allow" return into a jump just past the end of `part`.
fn chain_to_next(part: &mut [sock_filter]) {
    let len = part.len();
    for (idx, insn) in part.iter_mut().enumerate() {
        if insn.code == BPF_RET_K && insn.k == libc::SECCOMP_RET_ALLOW {
            *insn = stmt(BPF_JMP_JA, (len - idx - 1) as u32);
        }
    }
}

/// On x86_64, refuse every x32-tagged number with ENOSYS.
fn x32_guard(arch: TargetArch) -> BpfProgram {
    match arch {
        TargetArch::x86_64 => vec![
            stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR),
            sock_filter { code: BPF_JMP_JGE_K, jt: 0, jf: 1, k: X32_SYSCALL_BIT },
            stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | libc::ENOSYS.unsigned_abs()),
        ],
        _ => Vec::new(),
    }
}

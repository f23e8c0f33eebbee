//! The seccomp filter that hands the sandbox's socket calls to the supervisor: a short program
//! written out as data (so it can be read, and run offline by the tests' interpreter), and its
//! installation with a listener.
//!
//! ```text
//! arch ≠ native              → allow   (the command's own filter kills other ABIs)
//! nr has the x32 bit          → allow   (the command's own filter refuses those: ENOSYS)
//! connect, sendmsg, sendmmsg  → notify  (sendmsg's address is in memory, out of BPF's reach)
//! sendto with an address      → notify  (argument 4 is not NULL; all 64 bits compared)
//! anything else               → allow
//! ```
//!
//! Installed on the sandbox's init, so every process of the sandbox inherits it; the
//! supervisor is init's parent, outside the filter.
//!
//! Owns the notifying filter; may not decide calls (that is [`super::call`]'s).

use std::os::fd::{FromRawFd, OwnedFd};

use seccompiler::sock_filter;

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;

/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// `args[i]` starts at 16 + 8 i; little-endian, so its low half first.
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}

#[cfg(target_arch = "x86_64")]
const NATIVE_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const NATIVE_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the socket supervisor supports x86_64 and aarch64 (little-endian seccomp_data)");

/// Syscalls numbered at or above this on x86_64 are x32 ones.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The syscalls the supervisor performs on the command's behalf.
pub const NOTIFIED: [(&str, i64); 4] = [
    ("connect", libc::SYS_connect),
    ("sendto", libc::SYS_sendto),
    ("sendmsg", libc::SYS_sendmsg),
    ("sendmmsg", libc::SYS_sendmmsg),
];

const fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The filter program. Jumps are relative (`pc + 1 + offset`), so the two returns are at the
/// end and every test jumps forward to them.
pub fn program() -> Vec<sock_filter> {
    // Laid out as: [head] [syscall tests] [sendto's address test] NOTIFY ALLOW.
    let mut head = vec![stmt(BPF_LD_W_ABS, ARCH), jump(BPF_JMP_JEQ_K, NATIVE_ARCH, 0, 0), stmt(BPF_LD_W_ABS, NR)];
    let x32 = cfg!(target_arch = "x86_64");
    if x32 {
        head.push(jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 0));
    }
    let tests = [libc::SYS_connect, libc::SYS_sendmsg, libc::SYS_sendmmsg, libc::SYS_sendto];
    let addr = [
        stmt(BPF_LD_W_ABS, arg_low(4)),
        jump(BPF_JMP_JEQ_K, 0, 0, 0), // low half 0: look at the high half, else notify
        stmt(BPF_LD_W_ABS, arg_low(4) + 4),
        jump(BPF_JMP_JEQ_K, 0, 0, 0), // both 0: allow, else notify
    ];
    let len = head.len() + tests.len() + addr.len() + 2;
    let notify = len - 2;
    let allow = len - 1;
    // Offset from instruction `at` to `to`.
    let off = |at: usize, to: usize| (to - at - 1) as u8;
    let mut p = head;
    // Not the native architecture: allow.
    p[1].jf = off(1, allow);
    if x32 {
        p[3].jt = off(3, allow);
    }
    for nr in &tests {
        let at = p.len();
        if *nr == libc::SYS_sendto {
            // sendto: on to the address test; anything else: allow.
            p.push(jump(BPF_JMP_JEQ_K, *nr as u32, 0, off(at, allow)));
        } else {
            p.push(jump(BPF_JMP_JEQ_K, *nr as u32, off(at, notify), 0));
        }
    }
    let base = p.len();
    p.extend(addr);
    p[base + 1].jf = off(base + 1, notify);
    p[base + 3].jt = off(base + 3, allow);
    p[base + 3].jf = off(base + 3, notify);
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_USER_NOTIF));
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    p
}

/// Install [`program`] on the calling thread and return its listener. Asks the kernel to let
/// a notified call be interrupted only by a fatal signal once the supervisor has it (Linux
/// 5.19): the supervisor performs the call, and a call restarted after a signal would be
/// performed twice (a stream would get its data twice). Older kernels get the filter without.
///
/// The caller has `CAP_SYS_ADMIN` in its user namespace (the sandbox's init), so no
/// `PR_SET_NO_NEW_PRIVS` is needed here; the command sets it with its own filter.
pub fn install() -> Result<OwnedFd, rustix::io::Errno> {
    let prog = program();
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr().cast_mut().cast() };
    let mut last = rustix::io::Errno::INVAL;
    for flags in [
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
    ] {
        // SAFETY: seccomp(SET_MODE_FILTER) reads `fprog` and the program it points to, both
        // alive for the call; the listener fd it returns is ours.
        let fd = unsafe {
            libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, flags, &fprog as *const libc::sock_fprog)
        };
        if fd >= 0 {
            // SAFETY: a new descriptor the kernel just gave us (close-on-exec).
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        last = rustix::io::Errno::from_raw_os_error(crate::stage2::errno());
        if last != rustix::io::Errno::INVAL {
            break;
        }
    }
    Err(last)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    /// A classic-BPF interpreter for the instructions seccomp filters use here: enough to run
    /// a filter over a `seccomp_data` offline.
    pub(crate) fn run(prog: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        loop {
            let i = &prog[pc];
            match i.code {
                BPF_LD_W_ABS => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                    pc += 1;
                }
                BPF_JMP_JEQ_K => pc += 1 + usize::from(if acc == i.k { i.jt } else { i.jf }),
                BPF_JMP_JGE_K => pc += 1 + usize::from(if acc >= i.k { i.jt } else { i.jf }),
                0x05 => pc += 1 + i.k as usize,
                0x45 => pc += 1 + usize::from(if acc & i.k != 0 { i.jt } else { i.jf }),
                BPF_RET_K => return i.k,
                other => panic!("instruction {other:#x} not interpreted"),
            }
        }
    }

    const NOTIFY: u32 = libc::SECCOMP_RET_USER_NOTIF;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

    #[test]
    fn socket_calls_that_may_carry_an_address_are_notified() {
        let p = program();
        let call = |nr: i64, args: [u64; 6]| run(&p, nr as u32, NATIVE_ARCH, args);
        assert_eq!(call(libc::SYS_connect, [3, 0x1000, 110, 0, 0, 0]), NOTIFY);
        assert_eq!(call(libc::SYS_sendmsg, [3, 0x1000, 0, 0, 0, 0]), NOTIFY);
        assert_eq!(call(libc::SYS_sendmmsg, [3, 0x1000, 2, 0, 0, 0]), NOTIFY);
        // sendto: notified only with an address, whichever half of the pointer is non-zero.
        assert_eq!(call(libc::SYS_sendto, [3, 0x1000, 5, 0, 0, 0]), ALLOW);
        assert_eq!(call(libc::SYS_sendto, [3, 0x1000, 5, 0, 0x7fff_0000_1000, 110]), NOTIFY);
        assert_eq!(call(libc::SYS_sendto, [3, 0x1000, 5, 0, 1 << 32, 110]), NOTIFY);
        assert_eq!(call(libc::SYS_sendto, [3, 0x1000, 5, 0, 8, 0]), NOTIFY);
        for nr in [libc::SYS_read, libc::SYS_write, libc::SYS_recvmsg, libc::SYS_bind, libc::SYS_socket] {
            assert_eq!(call(nr, [3, 0x1000, 5, 0, 1, 1]), ALLOW, "{nr}");
        }
    }

    #[test]
    fn other_abis_are_left_to_the_commands_own_filter() {
        let p = program();
        assert_eq!(run(&p, libc::SYS_connect as u32, 0x4000_0003, [0; 6]), ALLOW);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(run(&p, X32_SYSCALL_BIT | libc::SYS_connect as u32, NATIVE_ARCH, [0; 6]), ALLOW);
        }
        // Every jump lands inside the program.
        for (at, i) in p.iter().enumerate() {
            if i.code == BPF_JMP_JEQ_K || i.code == BPF_JMP_JGE_K {
                assert!(at + 1 + usize::from(i.jt.max(i.jf)) < p.len(), "{at}: {i:?}");
            }
        }
    }
}

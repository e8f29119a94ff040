// Preemption signals: signals_install() catches SIGTERM (schedulers' and `kill`'s stop), SIGINT
// (Ctrl-C) and SIGUSR1 (Slurm's --signal=USR1@<seconds> warning before the time limit) and only
// records which came first; the training loop polls signals_pending() between steps, writes a
// checkpoint and exits with EXIT_PREEMPTED. A second SIGINT while a signal is pending (an
// impatient Ctrl-C) exits at once with status 130 (128 + SIGINT), without a checkpoint.
#pragma once

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "llmc/utils.h"

// The exit status of a run stopped by a signal after it wrote its checkpoint: 75 is EX_TEMPFAIL
// (sysexits.h, "try again later"), so a scheduler or wrapper script can tell it from success (0)
// and failure (1) and requeue the job, which then resumes from that checkpoint.
constexpr int EXIT_PREEMPTED = 75;

// The first signal caught, or 0; written only by the handler (all three are blocked while it runs).
inline volatile sig_atomic_t g_pending_signal = 0;

// Async-signal-safe: only a flag, write(2) and _exit.
static inline void signals_handler(int signal_number) {
    if (signal_number == SIGINT && g_pending_signal != 0) {
        static constexpr char MESSAGE[] = "\nsecond interrupt: exiting now, without a checkpoint\n";
        ssize_t ignored = write(STDERR_FILENO, MESSAGE, sizeof(MESSAGE) - 1);
        (void)ignored;
        _exit(130);
    }
    if (g_pending_signal == 0) { g_pending_signal = signal_number; }
}

// Installs the handler for SIGTERM, SIGINT and SIGUSR1 (SA_RESTART: interrupted reads and
// writes resume rather than fail with EINTR).
static inline void signals_install(void) {
    const int SIGNALS[] = {SIGTERM, SIGINT, SIGUSR1};
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = signals_handler;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (int s : SIGNALS) { sigaddset(&action.sa_mask, s); }
    for (int s : SIGNALS) {
        if (sigaction(s, &action, nullptr) != 0) { fail("cannot install a handler for signal %d: %s", s, strerror(errno)); }
    }
}

// The first of SIGTERM, SIGINT, SIGUSR1 caught since signals_install(), or 0 if none.
static inline int signals_pending(void) { return g_pending_signal; }

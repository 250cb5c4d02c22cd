//! The threads that share out a forward pass's parallel loops.
//!
//! A decode step is a chain of about 300 short parallel loops (ten per block: four
//! matmuls, the rounding of their inputs, attention, SwiGLU), each a few to a few
//! hundred microseconds long, with serial work between them. A work-stealing pool puts
//! its idle threads to sleep within microseconds, so most loops would pay for a futex
//! wake-up and a context switch, and the thread that asked for the loop would sleep
//! too: a batched step would spend a good share of its time in the OS scheduler. Here
//! the caller works on its own loops, and the helpers spin between loops for as long as
//! a [`session`] lasts (a forward pass), then sleep until the next one.
//!
//! Tasks are claimed from one atomic word holding the loop's number and the next task
//! index, so a helper that arrives late at a loop it has missed can never run a task of
//! the wrong one; the caller returns only once every task has finished, which is what
//! lets the helpers borrow the caller's closure.
//!
//! In the browser, the wasm build with shared memory (`+atomics`) has the same team,
//! but wasm cannot start threads: the page says how many helpers it will start
//! ([`plan_helpers`]) and each is a Web Worker that instantiates the module on the
//! same memory and calls [`join`]. A helper that never arrives only leaves its tasks
//! to the others, as the caller claims tasks too. The build without shared memory runs
//! every loop on the one thread.

#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
mod threads {
    use std::any::Any;
    use std::cell::Cell;
    use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

    /// A loop's closure with its lifetime erased (see [`Team::run`] for why that is
    /// sound).
    type Task = *const (dyn Fn(usize) + Sync + 'static);

    /// The loop the helpers are to work on.
    #[derive(Clone, Copy)]
    struct Job {
        number: u32,
        task: Task,
        n: usize,
    }

    // SAFETY: a `Job` is shared only through `Team::job` and read by helpers, which
    // call its closure (which is `Sync`) only while the caller of `Team::run` waits
    // for it.
    unsafe impl Send for Job {}

    /// A value on a cache line of its own, so that the threads that write one
    /// counter do not slow down those that read the other.
    #[repr(align(128))]
    struct Line<T>(T);

    impl<T> std::ops::Deref for Line<T> {
        type Target = T;
        fn deref(&self) -> &T {
            &self.0
        }
    }

    struct Team {
        /// `(loop number << 32) | next task index`.
        word: Line<AtomicU64>,
        /// The current loop, written before its number is published in `word`.
        job: Mutex<Option<Job>>,
        /// Tasks of the current loop that have finished (or panicked).
        done: Line<AtomicUsize>,
        /// The first panic of the current loop's tasks.
        panic: Mutex<Option<Box<dyn Any + Send>>>,
        /// Whether a session is on (helpers spin) or not (helpers sleep).
        awake: AtomicBool,
        /// Wakes sleeping helpers.
        bell: Mutex<()>,
        ring: Condvar,
        /// One session at a time.
        session: Mutex<()>,
        helpers: usize,
    }

    thread_local! {
        /// Whether this thread is inside a session (it holds the team) or is running
        /// a task (a nested loop then runs inline).
        static STATE: Cell<State> = const { Cell::new(State::Outside) };
    }

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum State {
        Outside,
        InSession,
        InTask,
    }

    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The helpers the page will start (see [`plan_helpers`]).
    #[cfg(target_arch = "wasm32")]
    static PLANNED: AtomicUsize = AtomicUsize::new(0);

    /// Sets how many helpers the page will start ([`join`]), before the first parallel
    /// loop: the team's size is fixed then. Returns whether it was in time.
    #[cfg(target_arch = "wasm32")]
    pub fn plan_helpers(helpers: usize) -> bool {
        PLANNED.store(helpers, Ordering::SeqCst);
        team().helpers == helpers
    }

    /// A helper's whole life on the calling thread (a Web Worker the page started):
    /// never returns.
    #[cfg(target_arch = "wasm32")]
    pub fn join() -> ! {
        team().help()
    }

    fn team() -> &'static Team {
        static TEAM: OnceLock<&'static Team> = OnceLock::new();
        TEAM.get_or_init(|| {
            #[cfg(not(target_arch = "wasm32"))]
            let cores = {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                super::size(std::env::var("ACS_THREADS").ok().as_deref(), cores)
            };
            #[cfg(target_arch = "wasm32")]
            let cores = PLANNED.load(Ordering::SeqCst) + 1;
            let team: &'static Team = Box::leak(Box::new(Team {
                word: Line(AtomicU64::new(0)),
                job: Mutex::new(None),
                done: Line(AtomicUsize::new(0)),
                panic: Mutex::new(None),
                awake: AtomicBool::new(false),
                bell: Mutex::new(()),
                ring: Condvar::new(),
                session: Mutex::new(()),
                helpers: cores.saturating_sub(1),
            }));
            #[cfg(not(target_arch = "wasm32"))]
            for i in 0..team.helpers {
                let spawned = std::thread::Builder::new()
                    .name(format!("acs-team-{i}"))
                    .spawn(move || team.help());
                if spawned.is_err() {
                    // Fewer helpers only means fewer cores at work; loops still end,
                    // as the caller claims tasks too.
                    break;
                }
            }
            team
        })
    }

    /// Spins of `spin_loop` between yields of a waiting thread.
    const SPINS: u32 = 256;

    /// One turn of a busy wait: a spin hint, and every [`SPINS`] turns a yield, so
    /// that a waiting thread leaves the core to others that are runnable.
    fn pause(spins: &mut u32) {
        *spins = spins.wrapping_add(1);
        if spins.is_multiple_of(SPINS) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }

    impl Team {
        /// Claims the next tasks of loop `number` (of `n` tasks), if any are left:
        /// a share of what remains, so that early claims are large (few atomic
        /// operations on a line both cores write) and the last ones single tasks
        /// (the cores finish together).
        fn claim(&self, number: u32, n: usize) -> Option<std::ops::Range<usize>> {
            let mut w = self.word.load(Ordering::Acquire);
            loop {
                let (at, next) = ((w >> 32) as u32, (w & u64::from(u32::MAX)) as usize);
                if at != number || next >= n {
                    return None;
                }
                let take = ((n - next) / (2 * (self.helpers + 1))).max(1);
                match self.word.compare_exchange_weak(
                    w,
                    w + take as u64,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Some(next..next + take),
                    Err(now) => w = now,
                }
            }
        }

        /// Runs the tasks of `job` that this thread can claim.
        fn work(&self, job: Job) {
            while let Some(tasks) = self.claim(job.number, job.n) {
                // SAFETY: claiming tasks below `n` of loop `job.number` succeeded, so
                // that loop had not finished: its caller is still inside `run`,
                // waiting for these tasks' `done` increment below, and the closure it
                // borrowed to `job.task` is alive. `job` is that loop's, as `help`
                // checks that the number it read with the job matches the claimed one.
                let task = unsafe { &*job.task };
                let count = tasks.len();
                let outcome = catch_unwind(AssertUnwindSafe(|| tasks.for_each(task)));
                if let Err(p) = outcome {
                    lock(&self.panic).get_or_insert(p);
                }
                self.done.fetch_add(count, Ordering::Release);
            }
        }

        /// A helper's life: work on each new loop, spin between loops while a session
        /// is on, sleep otherwise.
        fn help(&self) -> ! {
            STATE.with(|s| s.set(State::InTask));
            let mut seen = 0u32;
            let mut spins = 0u32;
            loop {
                let number = (self.word.load(Ordering::Acquire) >> 32) as u32;
                if number != seen {
                    seen = number;
                    let job = *lock(&self.job);
                    if let Some(job) = job.filter(|j| j.number == number) {
                        self.work(job);
                    }
                    continue;
                }
                if self.awake.load(Ordering::Acquire) {
                    pause(&mut spins);
                    continue;
                }
                let mut bell = lock(&self.bell);
                while !self.awake.load(Ordering::SeqCst)
                    && (self.word.load(Ordering::SeqCst) >> 32) as u32 == seen
                {
                    bell = self.ring.wait(bell).unwrap_or_else(PoisonError::into_inner);
                }
            }
        }

        /// Runs `f(0)`, …, `f(n - 1)` on this thread and the helpers; returns when all
        /// have, and re-raises the first panic among them.
        fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
            // The next index shares a word with the loop number.
            assert!(u32::try_from(n).is_ok(), "fewer than 2^32 tasks per loop");
            let number = ((self.word.load(Ordering::Acquire) >> 32) as u32).wrapping_add(1);
            // SAFETY: only the lifetime is erased. Helpers call the closure only
            // after claiming one of this loop's tasks, and this function does not
            // return before `done` counts all `n` tasks finished, so no call outlives
            // the borrow.
            let task: Task = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Task>(f) };
            self.done.store(0, Ordering::Relaxed);
            *lock(&self.job) = Some(Job { number, task, n });
            self.word.store(u64::from(number) << 32, Ordering::Release);
            STATE.with(|s| s.set(State::InTask));
            self.work(Job { number, task, n });
            STATE.with(|s| s.set(State::InSession));
            let mut spins = 0u32;
            while self.done.load(Ordering::Acquire) < n {
                pause(&mut spins);
            }
            if let Some(p) = lock(&self.panic).take() {
                resume_unwind(p);
            }
        }
    }

    /// The threads of the forward pass, the caller's included.
    pub fn threads() -> usize {
        team().helpers + 1
    }

    /// Keeps the helpers awake (spinning) while `body` runs, so that its parallel
    /// loops start without waking threads: each forward pass runs in one, and code
    /// that calls the matmuls directly many times (a benchmark of them) should too,
    /// or each call pays for waking the helpers. Sessions on several threads take
    /// turns.
    pub fn session<R>(body: impl FnOnce() -> R) -> R {
        if STATE.with(Cell::get) != State::Outside {
            return body();
        }
        let team = team();
        if team.helpers == 0 {
            return body();
        }
        let _turn = lock(&team.session);
        struct End(&'static Team);
        impl Drop for End {
            fn drop(&mut self) {
                self.0.awake.store(false, Ordering::SeqCst);
                STATE.with(|s| s.set(State::Outside));
            }
        }
        let _end = End(team);
        team.awake.store(true, Ordering::SeqCst);
        drop(lock(&team.bell));
        team.ring.notify_all();
        STATE.with(|s| s.set(State::InSession));
        body()
    }

    /// `f(0)`, …, `f(n - 1)` in parallel (inline when nested in another loop's task).
    pub(crate) fn run(n: usize, f: impl Fn(usize) + Sync) {
        match STATE.with(Cell::get) {
            _ if n <= 1 => (0..n).for_each(f),
            State::InTask => (0..n).for_each(f),
            State::InSession => team().run(n, &f),
            State::Outside => session(|| team().run(n, &f)),
        }
    }
}

#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
pub(crate) use threads::run;
#[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
pub use threads::{join, plan_helpers};
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
pub use threads::{session, threads};

/// The team's size: `ACS_THREADS` when it is a positive number (to leave cores to
/// other work on a shared machine), else every core.
#[cfg(not(target_arch = "wasm32"))]
fn size(setting: Option<&str>, cores: usize) -> usize {
    setting
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(cores)
}

/// The threads of the forward pass: one in the wasm build without shared memory.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
pub fn threads() -> usize {
    1
}

/// Runs `body` (one thread in the wasm build without shared memory).
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
pub fn session<R>(body: impl FnOnce() -> R) -> R {
    body()
}

/// `f(0)`, …, `f(n - 1)`, in order (one thread in the wasm build without shared
/// memory).
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
pub(crate) fn run(n: usize, f: impl Fn(usize) + Sync) {
    (0..n).for_each(f)
}

/// `f(i, chunk)` for each `chunk`-long piece `i` of `out`, in parallel (the last
/// piece may be shorter).
pub(crate) fn for_each_chunk_mut<T: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    assert!(chunk > 0, "chunks of at least one element");
    let len = out.len();
    let base = SendPtr(out.as_mut_ptr());
    run(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        let n = chunk.min(len - start);
        // SAFETY: `run` calls each index once, so the pieces `start..start + n` are
        // disjoint parts of `out`, which stays mutably borrowed until `run` returns
        // after every call.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), n) };
        f(i, piece)
    });
}

/// A pointer into a slice whose disjoint parts go to several threads.
struct SendPtr<T>(*mut T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SendPtr<T> {}

// SAFETY: `SendPtr` only carries the pointer; `for_each_chunk_mut` hands each thread a
// disjoint piece of a slice of `T: Send`.
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as for `Send`: the threads never touch the same elements.
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// Through a method, so that closures capture the whole (`Sync`) wrapper.
    fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_task_runs_once_in_and_out_of_sessions() {
        let counts: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        run(counts.len(), |i| {
            counts[i].fetch_add(1, Ordering::Relaxed);
        });
        session(|| {
            for _ in 0..200 {
                run(counts.len(), |i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
            }
        });
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 201));
    }

    #[test]
    fn acs_threads_sets_the_size_when_it_is_a_positive_number() {
        assert_eq!(size(None, 16), 16);
        assert_eq!(size(Some("4"), 16), 4);
        assert_eq!(size(Some(" 32 "), 16), 32);
        assert_eq!(size(Some("0"), 16), 16);
        assert_eq!(size(Some("many"), 16), 16);
    }

    #[test]
    fn chunks_cover_the_slice_once() {
        let mut v = vec![0usize; 1003];
        for_each_chunk_mut(&mut v, 10, |i, piece| {
            for (k, x) in piece.iter_mut().enumerate() {
                *x += i * 10 + k;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| x == i));
    }

    #[test]
    fn nested_loops_run_inline() {
        let total = AtomicUsize::new(0);
        run(8, |_| {
            run(10, |j| {
                total.fetch_add(j, Ordering::Relaxed);
            })
        });
        assert_eq!(total.load(Ordering::Relaxed), 8 * 45);
    }

    #[test]
    fn sessions_on_many_threads_take_turns() {
        let sums: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|t| {
                    s.spawn(move || {
                        let sum = AtomicUsize::new(0);
                        session(|| {
                            for _ in 0..50 {
                                run(64, |i| {
                                    sum.fetch_add(i * t, Ordering::Relaxed);
                                });
                            }
                        });
                        sum.into_inner()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (t, sum) in sums.into_iter().enumerate() {
            assert_eq!(sum, 50 * t * (63 * 64 / 2));
        }
    }

    #[test]
    fn a_task_panic_reaches_the_caller() {
        let finished = AtomicUsize::new(0);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(100, |i| {
                if i == 37 {
                    panic!("task 37");
                }
                finished.fetch_add(1, Ordering::Relaxed);
            })
        }));
        assert!(caught.is_err());
        // The tasks claimed with task 37 after it are skipped.
        assert!(finished.load(Ordering::Relaxed) < 100);
        // The team still works afterwards.
        let n = AtomicUsize::new(0);
        run(50, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 50);
    }
}

//! The runner's inner half: drawing and sending requests (closed loop, open-loop
//! schedules, trace times) and deciding each one as it finishes.

use super::*;

impl Inner {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Finished> {
        self.finished.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.t0).as_secs_f64()
    }

    pub(super) fn stopped(&self) -> bool {
        *self.abort.borrow() || self.halted.load(Ordering::Relaxed)
    }

    /// The next sequence number, or `None` once no more may be sent.
    pub(super) fn next_seq(&self) -> Option<u64> {
        if self.stopped() {
            return None;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if self.s.max_requests.is_some_and(|max| seq + 1 >= max) {
            self.halted.store(true, Ordering::Relaxed);
        }
        Some(seq)
    }

    pub(super) fn outgoing(&self, t: &Template, seq: u64) -> Outgoing {
        if let Some((k, p)) = self.s.probes.as_ref().and_then(|p| p.pick(seq)) {
            return Outgoing {
                api: p.api,
                model: p.model.clone(),
                body: p.body.clone(),
                id: format!("replay-{:08x}-{seq}", self.nonce),
                concurrency: 0,
                probe: Some(k),
                inject: None,
                tenant: None,
            };
        }
        if let Some((kind, body)) = self.s.injector.as_ref().and_then(|i| i.pick(seq)) {
            return Outgoing {
                api: super::super::plan::ReplayApi::Chat,
                model: t.model.clone(),
                body,
                id: format!("replay-{:08x}-{seq}", self.nonce),
                concurrency: 0,
                probe: None,
                inject: Some(kind),
                tenant: t.tenant.clone(),
            };
        }
        Outgoing {
            api: t.api,
            model: t.model.clone(),
            body: Bytes::from(self.s.prompts.body(t, seq)),
            id: format!("replay-{:08x}-{seq}", self.nonce),
            concurrency: 0,
            probe: None,
            inject: None,
            tenant: t.tenant.clone(),
        }
    }

    /// A closed-loop worker: one request at a time until `deadline` or a stop.
    pub(super) async fn worker(self: Arc<Self>, step: usize, deadline: Instant, cancel: Cancel) {
        while Instant::now() < deadline {
            let Some(seq) = self.next_seq() else { break };
            let out = self.outgoing(self.s.workload.draw(self.s.seed, seq), seq);
            self.clone().send(out, None, step, cancel.clone()).await;
        }
    }

    /// Sends an open-loop schedule from a thread of its own (a blocking-pool thread):
    /// each body is built ahead, then the thread sleeps until the request's time (OS
    /// sleep: tens of µs precision, against the runtime timer's 1 ms) and spawns the
    /// request onto the runtime. Returns the request tasks and whether it stopped early.
    pub(super) async fn open_loop(
        self: Arc<Self>,
        plan: Plan,
        start: Instant,
        step: usize,
        cancel: &Cancel,
        tag: Option<super::super::inject::Kind>,
    ) -> (JoinSet<()>, bool) {
        let cancel = cancel.clone();
        let run =
            tokio::task::spawn_blocking(move || self.schedule(plan, start, step, cancel, tag));
        run.await.unwrap_or_else(|_| (JoinSet::new(), true))
    }

    pub(super) fn schedule(
        self: Arc<Self>,
        plan: Plan,
        start: Instant,
        step: usize,
        cancel: Cancel,
        tag: Option<super::super::inject::Kind>,
    ) -> (JoinSet<()>, bool) {
        let mut tasks = JoinSet::new();
        let workload = self.s.workload.clone();
        let (mut arrivals, mut k) = (None, 0usize);
        loop {
            let (at, template) = match plan {
                Plan::Rate { rate, seed, until } => {
                    let at = arrivals
                        .get_or_insert_with(|| Poisson::new(rate, seed))
                        .next_offset();
                    if at >= until {
                        return (tasks, false);
                    }
                    (at, None)
                }
                Plan::Trace { scale } => {
                    let Some(t) = workload.templates.get(k) else {
                        return (tasks, false);
                    };
                    k += 1;
                    (
                        Duration::from_secs_f64((t.at_ms / 1000.0 / scale).max(0.0)),
                        Some(t),
                    )
                }
            };
            let Some(seq) = self.next_seq() else {
                return (tasks, true);
            };
            let t = template.unwrap_or_else(|| workload.draw(self.s.seed, seq));
            let mut out = self.outgoing(t, seq);
            if out.inject.is_none() && out.probe.is_none() {
                out.inject = tag;
            }
            let scheduled = start + at;
            if !self.sleep_until(scheduled) {
                return (tasks, true);
            }
            while self.in_flight.load(Ordering::Relaxed) >= self.s.max_in_flight {
                self.saturated.store(true, Ordering::Relaxed);
                if self.stopped() {
                    return (tasks, true);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            while tasks.try_join_next().is_some() {}
            tasks.spawn(
                self.clone()
                    .send(out, Some(scheduled), step, cancel.clone()),
            );
        }
    }

    /// Sleeps the thread until `t`; false when aborted first.
    pub(super) fn sleep_until(&self, t: Instant) -> bool {
        loop {
            if *self.abort.borrow() {
                return false;
            }
            let now = Instant::now();
            if now >= t {
                return true;
            }
            std::thread::sleep((t - now).min(Duration::from_millis(50)));
        }
    }

    pub(super) async fn send(
        self: Arc<Self>,
        mut out: Outgoing,
        scheduled: Option<Instant>,
        step: usize,
        cancel: Cancel,
    ) {
        out.concurrency = self
            .in_flight
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let (probe, inject) = (out.probe, out.inject);
        // As the proxy keeps the tenant header's value: its salted hash.
        let tenant = match (&self.s.slo.tenant_header, &out.tenant) {
            (Some(_), Some(t)) => Some(self.s.slo.tenant_hash(t.as_bytes())),
            _ => None,
        };
        let long = out.body.len() as u64 >= self.s.slo.long_input_bytes;
        let long_before = if long {
            self.long_in_flight.fetch_add(1, Ordering::Relaxed)
        } else {
            self.long_in_flight.load(Ordering::Relaxed)
        };
        let m = self.s.client.send(out, cancel).await;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if long {
            self.long_in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        let mut record = m.record;
        record.arrival.long_in_flight = long_before > 0;
        record.tenant = tenant;
        crate::measure::verdict::judge(&mut record, &self.s.slo);
        let error = !matches!(record.outcome, Outcome::Ok | Outcome::ClientAbort);
        // The probe's name marks its line in the request log, whatever its outcome.
        let probe_name = probe.zip(self.s.probes.as_deref()).map(|(k, p)| p.name(k));
        // A probe is judged on its answer when it has one (errors are counted as such).
        let probe = match (probe, &self.s.probes) {
            (Some(k), Some(probes)) if record.outcome == Outcome::Ok => {
                let text =
                    super::super::probes::answer_text(m.answer.as_deref().unwrap_or_default());
                let verdict = probes.check(k, &text);
                Some(Box::new(super::super::probes::ProbeResult {
                    probe: k,
                    passed: verdict.is_ok(),
                    request_id: record.id.clone(),
                    excerpt: verdict
                        .is_err()
                        .then(|| super::super::probes::excerpt(&text)),
                    reason: verdict.err(),
                }))
            }
            _ => None,
        };
        self.s.progress.finished(record.ttft_ms, error);
        let mut finished = self.lock();
        let mut sample = Sample::of(&record, &mut finished.tables);
        sample
            .set_lag_ms(scheduled.map(|s| m.sent.saturating_duration_since(s).as_secs_f64() * 1e3));
        (sample.sent_s, sample.ended_s) = (self.secs(m.sent), self.secs(m.ended));
        (sample.step, sample.probe, sample.inject) = (step, probe, inject);
        sample.out_of_memory = m.out_of_memory;
        let window = *self.window();
        sample.measured = window.measures(&sample);
        // Only measured requests are read for ITL: their gaps go to their group, the
        // others' are dropped here.
        if sample.measured {
            let key = Key {
                step,
                slice: window
                    .slice
                    .map_or(0, |d| slice_of(sample.ended_s, window.lo, d)),
                class: sample.class,
                model: sample.model,
            };
            sample.itl = finished.tables.record(key, &m.gaps_us);
        }
        // Under the samples lock: the log's order is the samples' order.
        if let Some(log) = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            log.push(super::super::report::json::request_line(
                &sample, &record, probe_name,
            ));
        }
        finished.samples.push(sample);
    }
}

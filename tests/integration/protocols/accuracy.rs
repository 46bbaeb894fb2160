//! Accuracy against the simulator's ground truth.

use super::*;

#[test]
fn recorded_timings_agree_with_the_servers_ground_truth() {
    const N: usize = 40;
    const TOKENS: u32 = 10;
    exclusive(async {
        let (sim, upstream) = start_sim(fast_sim(20.0, 5.0)).await;
        let proxy = start_proxy(&upstream).await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let uri = format!("http://{}{CHAT}", proxy.proxy_addr);
        // Warm-up: opens the client and upstream connections so no request below pays a
        // connect inside its timings.
        let warm = send(
            &client,
            chat_request(&uri, "acc-warmup", chat_body(true, 2, true)).unwrap(),
        );
        assert_eq!(warm.await.unwrap().status, StatusCode::OK);

        let mut sent_at = BTreeMap::new();
        for i in 0..N {
            let id = format!("acc-{i}");
            let req = chat_request(&uri, &id, chat_body(true, TOKENS, true)).unwrap();
            let t_send = Instant::now();
            let resp = send(&client, req).await.unwrap();
            assert_eq!(resp.status, StatusCode::OK);
            sent_at.insert(id, t_send);
        }
        let ids: Vec<String> = sent_at.keys().cloned().collect();
        let recs = records_by_id(proxy.admin_addr, &ids, Duration::from_secs(5))
            .await
            .unwrap();
        let truths: BTreeMap<String, goodput::sim::Truth> = sim
            .truth()
            .into_iter()
            .filter_map(|t| Some((t.request_id.clone()?, t)))
            .collect();

        // Two comparisons, both on the one monotonic clock this process shares with the
        // simulator and the proxy:
        //
        // - TPOT: the record's (t_last − t_first)/(n − 1) against the same quantity from the
        //   instants the simulator wrote the first and last token. Delivery delay common to
        //   both events cancels out.
        //
        // - first-token lag: the proxy's first-token instant is t_arrival + ttft, but
        //   t_arrival is internal to the proxy. It is bracketed, though: the client sent the
        //   request before it (t_send ≤ t_arrival) and the simulator received it after the
        //   proxy forwarded it (t_arrival ≤ truth.received_at). So
        //       lag_hi = truth.received_at + ttft − truth.first_token_at
        //   over-states the true lag by exactly the request's forwarding delay and is an
        //   upper bound; asserting lag_hi ≤ 2 ms is therefore stricter than the requirement
        //   (it is also `record.ttft − server-side ttft`: the TTFT error itself). It must
        //   not be negative either: the proxy cannot see a token before it was written.
        //   (t_send + ttft − first would be a lower bound, useless for a ≤ check.)
        //
        // A loaded 2-core machine can stall any one request for a scheduler tick or more,
        // and a busy one many of them; a timing error of the proxy would show in every
        // request. So the bound is asserted on the median; the 95th percentile is the
        // machine's (the load benchmark measures it) and only reported.
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let (mut tpot_err, mut lag_hi) = (Vec::new(), Vec::new());
        for id in &ids {
            let (r, t) = (&recs[id], &truths[id]);
            assert_eq!(r["outcome"], "ok", "{r}");
            assert_eq!(
                r["output_tokens"].as_u64(),
                Some(t.completion_tokens),
                "{r}"
            );
            assert_eq!(r["input_tokens"].as_u64(), Some(t.prompt_tokens), "{r}");
            assert_eq!(r["events"].as_u64(), Some(u64::from(t.events)), "{r}");
            let (first, last) = (t.first_token_at.unwrap(), t.last_token_at.unwrap());
            let truth_tpot = ms(last - first) / (t.completion_tokens - 1) as f64;
            tpot_err.push((r["tpot_ms"].as_f64().unwrap() - truth_tpot).abs());
            let ttft = r["ttft_ms"].as_f64().unwrap();
            let truth_ttft = ms(first - t.received_at);
            let lag = ttft - truth_ttft;
            assert!(
                lag >= -0.001,
                "{id}: proxy saw the first token {lag:.3} ms before it was sent"
            );
            assert!(sent_at[id] <= t.received_at, "clocks disagree");
            lag_hi.push(lag);
        }
        let report = format!("tpot |error| ms {tpot_err:.3?}\nfirst-token lag ms {lag_hi:.3?}");
        eprintln!("{report}");
        for (what, values) in [
            ("tpot error", &mut tpot_err),
            ("first-token lag", &mut lag_hi),
        ] {
            let (p50, p95) = (percentile(values, 0.5), percentile(values, 0.95));
            assert!(p50 <= 2.0, "{what}: p50 {p50:.3} p95 {p95:.3} ms\n{report}");
        }
        // The 2 ms bound leaves room for a wrong definition: dividing by n instead of n - 1
        // is off by tpot/n = 0.5 ms here, in every request. With one shared clock the
        // typical request is exact to scheduling noise (~0.01 ms), so the median must be too.
        let p50 = percentile(&mut tpot_err, 0.5);
        assert!(p50 <= 0.1, "median tpot error {p50:.3} ms\n{report}");
        proxy.shutdown().await;
    });
}

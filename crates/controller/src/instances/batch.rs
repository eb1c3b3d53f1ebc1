//! Gathering the calls many node tasks make about single machines into one request per group
//! (a cloud region), as Karpenter's batcher does: a window opens with the first call and closes
//! when no call came for `idle`, when it has been open `max`, or when it holds `max_items`. A
//! rollout of 1,000 nodes then costs a handful of requests, not 1,000.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::InstanceError;

/// When a window of calls closes.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub idle: Duration,
    pub max: Duration,
    pub max_items: usize,
}

/// Answers for one group's machine ids; an id left out is answered with a transient error.
pub type Answers<R> = HashMap<String, Result<R, InstanceError>>;

/// Runs one request for a group's ids.
pub type Run<R> = Arc<dyn Fn(String, Vec<String>) -> BoxFuture<'static, Answers<R>> + Send + Sync>;

struct Call<R> {
    group: String,
    id: String,
    answer: oneshot::Sender<Result<R, InstanceError>>,
}

pub struct Batcher<R> {
    calls: mpsc::UnboundedSender<Call<R>>,
}

impl<R> std::fmt::Debug for Batcher<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl<R: Clone + Send + 'static> Batcher<R> {
    /// Starts the gathering task; it ends when the batcher is dropped.
    pub fn start(window: Window, run: Run<R>) -> Self {
        let (calls, queue) = mpsc::unbounded_channel();
        tokio::spawn(gather(window, run, queue));
        Self { calls }
    }

    /// The answer for one machine, from the request its window's group sends.
    pub async fn call(&self, group: &str, id: &str) -> Result<R, InstanceError> {
        let (answer, answered) = oneshot::channel();
        let call = Call {
            group: group.to_owned(),
            id: id.to_owned(),
            answer,
        };
        let stopped = || InstanceError::Transient("the request batcher has stopped".to_owned());
        self.calls.send(call).map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

async fn gather<R: Clone + Send + 'static>(
    window: Window,
    run: Run<R>,
    mut queue: mpsc::UnboundedReceiver<Call<R>>,
) {
    while let Some(first) = queue.recv().await {
        let opened = Instant::now();
        let mut last = opened;
        let mut calls = vec![first];
        while calls.len() < window.max_items {
            let closes = (last + window.idle).min(opened + window.max);
            tokio::select! {
                next = queue.recv() => match next {
                    Some(call) => {
                        calls.push(call);
                        last = Instant::now();
                    }
                    None => break,
                },
                () = tokio::time::sleep_until(closes) => break,
            }
        }
        dispatch(&window, &run, calls);
    }
}

/// One request per group and chunk of ids, each in a task of its own so the next window
/// gathers meanwhile; callers asking about the same machine share its answer.
fn dispatch<R: Clone + Send + 'static>(window: &Window, run: &Run<R>, calls: Vec<Call<R>>) {
    let mut groups: BTreeMap<String, BTreeMap<String, Vec<oneshot::Sender<_>>>> = BTreeMap::new();
    for call in calls {
        groups
            .entry(call.group)
            .or_default()
            .entry(call.id)
            .or_default()
            .push(call.answer);
    }
    for (group, waiting) in groups {
        let mut waiting: Vec<_> = waiting.into_iter().collect();
        while !waiting.is_empty() {
            let rest = waiting.split_off(waiting.len().min(window.max_items));
            let chunk = std::mem::replace(&mut waiting, rest);
            let ids = chunk.iter().map(|(id, _)| id.clone()).collect();
            let request = run(group.clone(), ids);
            tokio::spawn(async move {
                let mut answers = request.await;
                for (id, senders) in chunk {
                    let answer = answers.remove(&id).unwrap_or_else(|| {
                        Err(InstanceError::Transient(format!(
                            "the provider's answer left out {id}"
                        )))
                    });
                    for sender in senders {
                        let _ = sender.send(answer.clone());
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::sync::Mutex;

    type Requests = Arc<Mutex<Vec<(String, Vec<String>)>>>;

    fn recording(requests: &Requests) -> Run<String> {
        let requests = Arc::clone(requests);
        Arc::new(move |group: String, ids: Vec<String>| {
            requests.lock().unwrap().push((group.clone(), ids.clone()));
            async move {
                ids.into_iter()
                    .map(|id| {
                        let answer = if id == "bad" {
                            Err(InstanceError::Refused("protected".to_owned()))
                        } else {
                            Ok(format!("{group}/{id}"))
                        };
                        (id, answer)
                    })
                    .collect()
            }
            .boxed()
        })
    }

    const WINDOW: Window = Window {
        idle: Duration::from_millis(100),
        max: Duration::from_secs(1),
        max_items: 3,
    };

    #[tokio::test(start_paused = true)]
    async fn calls_within_a_window_share_a_request_per_group() {
        let requests = Arc::default();
        let window = Window {
            max_items: 10,
            ..WINDOW
        };
        let batcher = Arc::new(Batcher::start(window, recording(&requests)));
        let calls = [
            ("r1", "a"),
            ("r1", "b"),
            ("r2", "c"),
            ("r1", "a"),
            ("r1", "bad"),
        ]
        .map(|(group, id)| {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move { batcher.call(group, id).await })
        });
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap().map_err(|error| error.to_string()));
        }
        assert_eq!(answers[0], Ok("r1/a".to_owned()));
        assert_eq!(answers[3], Ok("r1/a".to_owned()));
        assert_eq!(answers[2], Ok("r2/c".to_owned()));
        assert!(answers[4].as_ref().unwrap_err().contains("protected"));
        let mut requests = requests.lock().unwrap().clone();
        requests.sort();
        // Three distinct ids of r1 fill one request; r2's goes alone.
        assert_eq!(
            requests,
            vec![
                (
                    "r1".to_owned(),
                    vec!["a".to_owned(), "b".to_owned(), "bad".to_owned()]
                ),
                ("r2".to_owned(), vec!["c".to_owned()]),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_closes_when_idle_or_full() {
        let requests = Arc::default();
        let batcher = Batcher::start(WINDOW, recording(&requests));
        batcher.call("r1", "a").await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        batcher.call("r1", "b").await.unwrap();
        assert_eq!(requests.lock().unwrap().len(), 2);
        // Four calls at once: the window closes at three, the fourth opens the next.
        let batcher = Arc::new(batcher);
        let calls = ["c", "d", "e", "f"].map(|id| {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move { batcher.call("r1", id).await })
        });
        for call in calls {
            call.await.unwrap().unwrap();
        }
        let requests = requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 4, "{requests:?}");
        assert_eq!(requests[2].1.len(), 3, "{requests:?}");
    }
}

//! The `aws` instance provider against moto's EC2 and STS: the real Query protocol, signed,
//! every call counted by moto's own recorder.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use nodegrace_controller::instances::aws::AwsOptions;
use nodegrace_controller::instances::{
    AwsInstances, InstanceError, InstanceProvider, InstanceState, Power, ProviderId,
};
use nodegrace_testing::wait_for;
use provider_testbed::moto::Moto;

const ZONE: &str = "us-east-1a";
const REGION: &str = "us-east-1";

fn options(moto: &Moto) -> AwsOptions {
    AwsOptions {
        endpoint_url: Some(moto.url.parse().unwrap()),
        region: Some(REGION.to_owned()),
        sts_endpoint_url: Some(moto.url.parse().unwrap()),
        timeout: Duration::from_secs(10),
    }
}

fn static_keys(name: &str) -> Option<String> {
    match name {
        "AWS_ACCESS_KEY_ID" => Some("AKIAPROGRAM".to_owned()),
        "AWS_SECRET_ACCESS_KEY" => Some("secret".to_owned()),
        _ => None,
    }
}

fn machine(zone: &str, id: &str) -> ProviderId {
    ProviderId::new(format!("aws:///{zone}/{id}")).read_from("node-a")
}

#[tokio::test]
async fn machines_are_described_terminated_and_powered_through_ec2() -> Result<()> {
    let moto = Moto::start().await?;
    let aws = AwsInstances::new(&options(&moto), static_keys)?;
    let ids = moto.run_instances(ZONE, 2).await?;
    let (first, second) = (machine(ZONE, &ids[0]), machine(ZONE, &ids[1]));
    ensure!(aws.state(&first).await? == InstanceState::Running);

    aws.terminate(&first).await?;
    ensure!(aws.state(&first).await? == InstanceState::Terminated);
    ensure!(moto.state(REGION, &ids[0]).await?.as_deref() == Some("terminated"));
    let terminations = moto.program_calls("TerminateInstances").await?;
    ensure!(terminations.len() == 1, "{terminations:?}");
    // Signed as SigV4 for EC2 in the machine's region.
    let signature = &terminations[0].authorization;
    ensure!(
        signature.starts_with("AWS4-HMAC-SHA256 Credential=AKIAPROGRAM/")
            && signature.contains(&format!("/{REGION}/ec2/aws4_request"))
            && signature.contains("SignedHeaders=content-type;host;x-amz-date"),
        "{signature}"
    );

    // Power: stopped with Force, started again; the state tells, not the request's answer.
    aws.power(&second, Power::Off).await?;
    wait_for("the machine to stop", || async {
        Ok(aws.state(&second).await? == InstanceState::Stopped)
    })
    .await?;
    let stops = moto.program_calls("StopInstances").await?;
    ensure!(
        stops.len() == 1 && stops[0].field("Force") == Some("true"),
        "{stops:?}"
    );
    aws.power(&second, Power::On).await?;
    ensure!(aws.state(&second).await? == InstanceState::Running);
    Ok(())
}

#[tokio::test]
async fn an_unknown_machine_is_not_found_and_its_termination_is_done() -> Result<()> {
    let moto = Moto::start().await?;
    let aws = AwsInstances::new(&options(&moto), static_keys)?;
    let unknown = machine(ZONE, "i-0123456789abcdef0");
    ensure!(aws.state(&unknown).await? == InstanceState::NotFound);
    aws.terminate(&unknown).await?;
    let power = aws.power(&unknown, Power::Off).await.unwrap_err();
    ensure!(power.to_string().contains("does not know"), "{power}");
    Ok(())
}

#[tokio::test]
async fn a_machine_of_another_region_is_held_without_a_call() -> Result<()> {
    let moto = Moto::start().await?;
    let aws = AwsInstances::new(&options(&moto), static_keys)?;
    // The instance exists in eu-west-1, but the endpoint serves us-east-1, where EC2 would
    // call it unknown.
    let ids = moto.run_instances("eu-west-1a", 1).await?;
    let elsewhere = machine("eu-west-1a", &ids[0]);
    let state = aws.state(&elsewhere).await.unwrap_err();
    ensure!(matches!(state, InstanceError::Refused(_)), "{state}");
    let terminate = aws.terminate(&elsewhere).await.unwrap_err();
    ensure!(
        terminate.to_string().contains("serves region us-east-1"),
        "{terminate}"
    );
    ensure!(moto.program_calls("DescribeInstances").await?.is_empty());
    ensure!(moto.program_calls("TerminateInstances").await?.is_empty());
    ensure!(moto.state("eu-west-1", &ids[0]).await?.as_deref() == Some("running"));
    Ok(())
}

/// Each machine terminated by a task of its own, all at once, as node tasks do.
async fn terminate_at_once(
    aws: &std::sync::Arc<AwsInstances>,
    ids: &[String],
) -> Result<HashMap<String, Result<(), InstanceError>>> {
    let calls: Vec<_> = ids
        .iter()
        .map(|id| {
            let aws = std::sync::Arc::clone(aws);
            let machine = machine(ZONE, id);
            (
                id.clone(),
                tokio::spawn(async move { aws.terminate(&machine).await }),
            )
        })
        .collect();
    let mut answers = HashMap::new();
    for (id, call) in calls {
        answers.insert(id, call.await?);
    }
    Ok(answers)
}

#[tokio::test]
async fn fifty_terminations_take_a_handful_of_calls_and_a_protected_machine_fails_alone()
-> Result<()> {
    let moto = Moto::start().await?;
    let aws = std::sync::Arc::new(AwsInstances::new(&options(&moto), static_keys)?);
    let ids = moto.run_instances(ZONE, 50).await?;
    let protected = ids[7].clone();
    moto.protect(REGION, &protected).await?;
    let answers = terminate_at_once(&aws, &ids).await?;
    for (id, answer) in &answers {
        if *id == protected {
            let error = answer.as_ref().unwrap_err();
            ensure!(matches!(error, InstanceError::Refused(_)), "{error}");
            ensure!(
                error.to_string().contains("OperationNotPermitted"),
                "{error}"
            );
        } else {
            ensure!(answer.is_ok(), "{id}: {answer:?}");
            ensure!(moto.state(REGION, id).await?.as_deref() == Some("terminated"));
        }
    }
    ensure!(moto.state(REGION, &protected).await?.as_deref() == Some("running"));
    // The batch the protected machine failed is retried machine by machine (Karpenter's
    // rule), so each machine is in at most one batch and one call of its own.
    let terminations = moto.program_calls("TerminateInstances").await?;
    let batched = terminations
        .iter()
        .filter(|call| call.instance_ids().len() > 1)
        .count();
    ensure!(batched <= 3, "{batched} batched calls");
    for id in &ids {
        let alone = terminations
            .iter()
            .filter(|call| call.instance_ids() == [id.as_str()])
            .count();
        ensure!(alone <= 1, "{id} was sent alone {alone} times");
    }

    // Without the protected machine in the window: one call, or a few.
    let moto = Moto::start().await?;
    let aws = std::sync::Arc::new(AwsInstances::new(&options(&moto), static_keys)?);
    let ids = moto.run_instances(ZONE, 50).await?;
    for (id, answer) in terminate_at_once(&aws, &ids).await? {
        ensure!(answer.is_ok(), "{id}: {answer:?}");
    }
    let terminations = moto.program_calls("TerminateInstances").await?;
    ensure!(
        (1..=3).contains(&terminations.len()),
        "{} TerminateInstances calls for 50 machines",
        terminations.len()
    );
    println!(
        "aws batch nodes=50 terminate-calls={} describe-calls={}",
        terminations.len(),
        moto.program_calls("DescribeInstances").await?.len()
    );
    Ok(())
}

#[tokio::test]
async fn irsa_keys_come_from_sts_assume_role_with_web_identity() -> Result<()> {
    let moto = Moto::start().await?;
    let dir = tempfile::tempdir()?;
    let token = dir.path().join("token");
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.projected.token")?;
    let token_path = token.display().to_string();
    let env = move |name: &str| match name {
        "AWS_WEB_IDENTITY_TOKEN_FILE" => Some(token_path.clone()),
        "AWS_ROLE_ARN" => Some("arn:aws:iam::123456789012:role/nodegrace".to_owned()),
        "AWS_ROLE_SESSION_NAME" => Some("termination-controller".to_owned()),
        _ => None,
    };
    let aws = AwsInstances::new(&options(&moto), env)?;
    ensure!(aws.credentials().contains("IRSA"));
    let ids = moto.run_instances(ZONE, 1).await?;
    ensure!(aws.state(&machine(ZONE, &ids[0])).await? == InstanceState::Running);
    let recorded = moto.recorded().await?;
    let assumed: Vec<_> = recorded
        .iter()
        .filter(|request| request.action() == "AssumeRoleWithWebIdentity")
        .collect();
    ensure!(assumed.len() == 1, "{assumed:?}");
    ensure!(
        assumed[0].field("WebIdentityToken") == Some("eyJhbGciOiJSUzI1NiJ9.projected.token")
            && assumed[0].field("RoleSessionName") == Some("termination-controller"),
        "{assumed:?}"
    );
    // The EC2 call is signed with the temporary keys STS issued, and carries their token.
    let described = moto.program_calls("DescribeInstances").await?;
    ensure!(described.len() == 1, "{described:?}");
    ensure!(
        described[0].authorization.contains("Credential=ASIA")
            && described[0].security_token.is_some(),
        "{described:?}"
    );
    // The keys are cached until shortly before they expire: a second call asks STS nothing.
    aws.state(&machine(ZONE, &ids[0])).await?;
    let assumed = moto
        .recorded()
        .await?
        .iter()
        .filter(|request| request.action() == "AssumeRoleWithWebIdentity")
        .count();
    ensure!(assumed == 1, "{assumed} STS calls");
    Ok(())
}

#[tokio::test]
async fn an_endpoint_out_of_reach_is_an_error_not_a_missing_machine() -> Result<()> {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let aws = AwsInstances::new(
        &AwsOptions {
            endpoint_url: Some(format!("http://{closed}").parse()?),
            region: Some(REGION.to_owned()),
            sts_endpoint_url: None,
            timeout: Duration::from_secs(2),
        },
        static_keys,
    )?;
    let id = machine(ZONE, "i-0123456789abcdef0");
    let state = aws.state(&id).await.unwrap_err();
    ensure!(matches!(state, InstanceError::Transient(_)), "{state}");
    ensure!(state.to_string().contains("cannot be reached"), "{state}");
    let terminate = aws.terminate(&id).await.unwrap_err();
    ensure!(
        matches!(terminate, InstanceError::Transient(_)),
        "{terminate}"
    );
    Ok(())
}

/// The interposer the explorer puts between the programs and EC2 (docs/explore.md): each of
/// its faults reaches the provider as EC2's own would, and its hook sees what reached EC2.
#[tokio::test]
async fn the_explorers_cloud_faults_reach_the_provider_as_ec2s() -> Result<()> {
    use std::sync::{Arc, Mutex};

    use provider_testbed::interposer::{Forwarding, Interposer, Mode};

    let moto = Moto::start().await?;
    let cloud = Interposer::start(&moto.url).await?;
    let forwarded: Arc<Mutex<Vec<Forwarding>>> = Arc::default();
    let seen = Arc::clone(&forwarded);
    cloud.set_hook(Arc::new(move |forwarding| {
        seen.lock().unwrap().push(forwarding);
        Box::pin(async {})
    }));
    let aws = AwsInstances::new(
        &AwsOptions {
            endpoint_url: Some(cloud.url().parse()?),
            timeout: Duration::from_secs(2),
            ..options(&moto)
        },
        static_keys,
    )?;
    let ids = moto.run_instances(ZONE, 2).await?;
    let (hidden, shown) = (machine(ZONE, &ids[0]), machine(ZONE, &ids[1]));

    // EC2's eventual consistency: a machine left out of the answer is not found, for a while.
    cloud.hide(
        &ids[0],
        tokio::time::Instant::now() + Duration::from_secs(3),
    );
    ensure!(aws.state(&hidden).await? == InstanceState::NotFound);
    ensure!(aws.state(&shown).await? == InstanceState::Running);
    wait_for("the machine to be known", || async {
        Ok(aws.state(&hidden).await? == InstanceState::Running)
    })
    .await?;

    // Throttling and 500s: errors, never a state, and nothing reaches EC2.
    let before = forwarded.lock().unwrap().len();
    for fault in [Mode::Throttle, Mode::InternalError] {
        cloud.set(fault.clone());
        let answer = aws.state(&shown).await;
        ensure!(answer.is_err(), "{fault:?} answered {answer:?}");
    }
    ensure!(forwarded.lock().unwrap().len() == before);
    ensure!(cloud.failed() >= 2);

    // A lost answer: the call fails at the client's timeout, but EC2 acted.
    cloud.set(Mode::LoseAnswers);
    ensure!(aws.terminate(&shown).await.is_err());
    ensure!(moto.state(REGION, &ids[1]).await?.as_deref() == Some("terminated"));
    let last = forwarded.lock().unwrap().last().cloned();
    ensure!(
        last.as_ref()
            .is_some_and(|last: &Forwarding| last.action == "TerminateInstances"
                && last.instance_ids == [ids[1].clone()]
                && last.method == "POST"
                && last.answer_lost),
        "{last:?}"
    );
    cloud.set(Mode::Forward);
    ensure!(aws.state(&shown).await? == InstanceState::Terminated);
    Ok(())
}

/// Each answer that is not EC2 saying "gone" is an error: an IAM refusal, an endpoint that
/// hangs past the timeout, and a server that answers 200 with a document that is not EC2's
/// (an S3 endpoint given as `--aws-endpoint-url`), whose empty listing must never read as "no
/// such instance". The machine is untouched by all of them.
#[tokio::test]
async fn refusals_hangs_and_foreign_documents_are_errors_never_a_machine_gone() -> Result<()> {
    use provider_testbed::interposer::{Interposer, Mode};

    let moto = Moto::start().await?;
    let cloud = Interposer::start(&moto.url).await?;
    let aws = AwsInstances::new(
        &AwsOptions {
            endpoint_url: Some(cloud.url().parse()?),
            timeout: Duration::from_secs(1),
            ..options(&moto)
        },
        static_keys,
    )?;
    let ids = moto.run_instances(ZONE, 1).await?;
    let id = machine(ZONE, &ids[0]);

    cloud.set(Mode::Refuse("StopInstances".to_owned()));
    let refused = aws.power(&id, Power::Off).await.unwrap_err();
    ensure!(matches!(refused, InstanceError::Refused(_)), "{refused}");
    ensure!(
        refused.to_string().contains("ec2:StopInstances"),
        "{refused}"
    );
    ensure!(
        aws.state(&id).await? == InstanceState::Running,
        "others are forwarded"
    );

    cloud.set(Mode::Hang("TerminateInstances".to_owned()));
    let hung = aws.terminate(&id).await.unwrap_err();
    ensure!(matches!(hung, InstanceError::Transient(_)), "{hung}");

    cloud.set(Mode::ForeignDocument);
    for answer in [
        aws.state(&id).await.map(|state| state.to_string()),
        aws.terminate(&id).await.map(|()| "terminated".to_owned()),
        aws.power(&id, Power::Off)
            .await
            .map(|()| "powered off".to_owned()),
    ] {
        let error = answer
            .err()
            .map(|error| error.to_string())
            .unwrap_or_default();
        ensure!(error.contains("the endpoint is not EC2"), "{error:?}");
    }
    ensure!(moto.state(REGION, &ids[0]).await?.as_deref() == Some("running"));
    ensure!(moto.program_calls("TerminateInstances").await?.is_empty());
    ensure!(moto.program_calls("StopInstances").await?.is_empty());
    Ok(())
}

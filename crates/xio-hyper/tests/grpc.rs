//! tonic over X-IO: a unary and a server-streaming gRPC service, the
//! client through `Endpoint::connect_with_connector(XioConnector)` and the
//! server through `serve_with_incoming(xio_hyper::incoming(listener))`.
//! The protobuf messages are written by hand with prost's derive (no
//! protoc needed), and so is the routing code tonic-build would generate.

#[path = "../../xio-core/tests/common/process_dir.rs"]
mod process_dir;

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codec::ProstCodec;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use xio_core::manager::Manager;
use xio_hyper::{Net, XioConnector, XioListener};

const WATCHDOG: Duration = Duration::from_secs(120);

#[derive(Clone, PartialEq, prost::Message)]
struct HelloRequest {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(uint32, tag = "2")]
    count: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HelloReply {
    #[prost(string, tag = "1")]
    message: String,
}

/// The service: `/demo.Greeter/SayHello` (unary) and
/// `/demo.Greeter/SayMany` (server streaming: `count` replies).
#[derive(Clone)]
struct Greeter;

impl tonic::server::NamedService for Greeter {
    const NAME: &'static str = "demo.Greeter";
}

struct SayHello;
impl tonic::server::UnaryService<HelloRequest> for SayHello {
    type Response = HelloReply;
    type Future = BoxFuture<tonic::Response<HelloReply>, tonic::Status>;
    fn call(&mut self, req: tonic::Request<HelloRequest>) -> Self::Future {
        Box::pin(async move {
            // As over TCP: the service sees where the call came from.
            if req.remote_addr().is_none() || req.local_addr().is_none() {
                return Err(tonic::Status::internal("no remote_addr/local_addr"));
            }
            Ok(tonic::Response::new(HelloReply {
                message: format!("hello {}", req.into_inner().name),
            }))
        })
    }
}

struct Replies(std::vec::IntoIter<HelloReply>);
impl futures_core::Stream for Replies {
    type Item = Result<HelloReply, tonic::Status>;
    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.get_mut().0.next().map(Ok))
    }
}

struct SayMany;
impl tonic::server::ServerStreamingService<HelloRequest> for SayMany {
    type Response = HelloReply;
    type ResponseStream = Replies;
    type Future = BoxFuture<tonic::Response<Replies>, tonic::Status>;
    fn call(&mut self, req: tonic::Request<HelloRequest>) -> Self::Future {
        Box::pin(async move {
            let r = req.into_inner();
            let v: Vec<HelloReply> = (0..r.count)
                .map(|i| HelloReply {
                    message: format!("{} #{i}", r.name),
                })
                .collect();
            Ok(tonic::Response::new(Replies(v.into_iter())))
        })
    }
}

impl<B> Service<http::Request<B>> for Greeter
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match req.uri().path() {
            "/demo.Greeter/SayHello" => Box::pin(async move {
                let mut g =
                    tonic::server::Grpc::new(ProstCodec::<HelloReply, HelloRequest>::default());
                Ok(g.unary(SayHello, req).await)
            }),
            "/demo.Greeter/SayMany" => Box::pin(async move {
                let mut g =
                    tonic::server::Grpc::new(ProstCodec::<HelloReply, HelloRequest>::default());
                Ok(g.server_streaming(SayMany, req).await)
            }),
            _ => Box::pin(
                async move { Ok(tonic::Status::unimplemented("no such method").into_http()) },
            ),
        }
    }
}

#[test]
fn tonic_unary_and_server_streaming_over_xio() {
    let dir = process_dir::process_dir("xio-grpc-test");
    std::env::set_var("XIO_RUN_DIR", &dir);
    let p = format!("tg-{}", std::process::id());
    let _mgr = Manager::builder(&p).spawn().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.6.0.1:50051").unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(Greeter)
                .serve_with_incoming(xio_hyper::incoming(l)),
        );
        let channel = tonic::transport::Endpoint::from_static("http://10.6.0.1:50051")
            .connect_with_connector(XioConnector::with_net(cli.clone()))
            .await
            .unwrap();
        let mut client = tonic::client::Grpc::new(channel);

        for i in 0..100 {
            client.ready().await.unwrap();
            let r: tonic::Response<HelloReply> = client
                .unary(
                    tonic::Request::new(HelloRequest {
                        name: format!("x-io {i}"),
                        count: 0,
                    }),
                    http::uri::PathAndQuery::from_static("/demo.Greeter/SayHello"),
                    ProstCodec::<HelloRequest, HelloReply>::default(),
                )
                .await
                .unwrap();
            assert_eq!(r.into_inner().message, format!("hello x-io {i}"));
        }

        client.ready().await.unwrap();
        let r: tonic::Response<tonic::Streaming<HelloReply>> = client
            .server_streaming(
                tonic::Request::new(HelloRequest {
                    name: "stream".into(),
                    count: 500,
                }),
                http::uri::PathAndQuery::from_static("/demo.Greeter/SayMany"),
                ProstCodec::<HelloRequest, HelloReply>::default(),
            )
            .await
            .unwrap();
        let mut s = r.into_inner();
        let mut n = 0;
        while let Some(m) = tokio::time::timeout(WATCHDOG, s.message())
            .await
            .expect("watchdog")
            .unwrap()
        {
            assert_eq!(m.message, format!("stream #{n}"));
            n += 1;
        }
        assert_eq!(n, 500);

        client.ready().await.unwrap();
        let e = client
            .unary::<_, HelloReply, _>(
                tonic::Request::new(HelloRequest::default()),
                http::uri::PathAndQuery::from_static("/demo.Greeter/Nope"),
                ProstCodec::<HelloRequest, HelloReply>::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unimplemented);
        server.abort();
    });
}

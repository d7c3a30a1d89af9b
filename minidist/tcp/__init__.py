"""Wing: the TCP transport, the gloo half of "DDP over gloo/MPI".

    md.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=r, world_size=n)

    rendezvous  env:// and tcp:// rendezvous: the store, the authenticated hello, the ports
    handshake   the HMAC handshake every connection opens with; the rendezvous' JSON messages
    rendezvous_server  rank 0 serving registrations; accepting connections side by side
    transport   TCPTransport: framed, authenticated point-to-point messages between the ranks
    wire        the data messages' header, bounds and receive state
    receiving   TCPTransport's receives: the progress that reads every socket, RecvRequest
    sending     TCPTransport's isend: one sendmsg, progressing receives while blocked
    side_channel  the side channel on the data sockets (negative tags)
    launch_args, launch_rank  ``python -m minidist.launch``'s command line, and one rank it
                started (its output relay, its notice)

``python -m minidist.launch`` (minidist/launch.py) starts ranks that meet here.
"""

from minidist.tcp.attach import attach

attach()

"""Wing: the TCP transport, the gloo half of "DDP over gloo/MPI".

    md.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=r, world_size=n)

    rendezvous  env:// and tcp:// rendezvous: the store, the authenticated hello, the ports
    transport   TCPTransport: framed, authenticated point-to-point messages between the ranks

``python -m minidist.launch`` (minidist/launch.py) starts ranks that meet here.
"""

from minidist.tcp.attach import attach

attach()

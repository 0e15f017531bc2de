"""The HTTP API on several replicas of the model, with Ray Serve (`s2core serve --replicas N`).

    scaling.py   the replica count, autoscaling and backpressure as Ray Serve's deployment
                 options (pure Python: checked before Ray starts)
    routing.py   the voice a request asks for, read from its body: the key requests are routed
                 by (pure Python)
    asgi.py      one HTTP request through an ASGI app in-process, its response as messages
    ray_app.py   the two deployments (the gateway every request enters, the replicas that run
                 the model) and the application builder `serve run` uses
    launch.py    `s2core serve --replicas N`: start or join Ray, run the application, wait

Ray is the optional `ray` extra: only ray_app.py and launch.py import it, and only this
package imports them.
"""

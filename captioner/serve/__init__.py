"""``captioner serve``: a web page and a JSON API in front of trained checkpoints.

* :mod:`~captioner.serve.checkpoints`: the checkpoints a server holds and the batched n-best decoding of a group
  of images;
* :mod:`~captioner.serve.batching`: the dynamic batcher, which decodes requests arriving together as one batch;
* :mod:`~captioner.serve.decoding_process`: the models in a child process of their own;
* :mod:`~captioner.serve.schemas`: the JSON of the API (and so its OpenAPI schema);
* :mod:`~captioner.serve.errors`: every refusal as a 4xx or 503 ``{"error": "<one line>"}``;
* :mod:`~captioner.serve.access`: who may talk to the server (host names, origins, a token);
* :mod:`~captioner.serve.limits`: the queue's bound, the deadline, the memory budget of image decoding;
* :mod:`~captioner.serve.connections`: the connection limits uvicorn leaves out (slow and huge request heads,
  pipelining, the number of connections);
* :mod:`~captioner.serve.app`: the FastAPI application, its routes and :func:`~captioner.serve.app.serve`;
* ``static/``: the page (HTML, CSS, JavaScript; no build step, nothing fetched from elsewhere).
"""

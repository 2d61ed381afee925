"""``captioner serve``: a web page and a JSON API in front of trained checkpoints.

* :mod:`~captioner.serve.checkpoints`: the checkpoints a server holds (loaded once, named by their run) and
  the batched n-best decoding of one group of images;
* :mod:`~captioner.serve.batching`: the dynamic batcher, one worker thread that has requests arriving
  together decoded as one batched beam search;
* :mod:`~captioner.serve.decoding_process`: the models in a child process of their own, which decodes each
  batch without waiting for the web server's Python;
* :mod:`~captioner.serve.schemas`: the JSON of the API (and so its OpenAPI schema);
* :mod:`~captioner.serve.errors`: every refusal as a 4xx or 503 ``{"error": "<one line>"}``, the upload size limit;
* :mod:`~captioner.serve.access`: who may talk to the server (its host names, other origins, a token);
* :mod:`~captioner.serve.limits`: what the server holds at once and how long it waits (the queue's bound, the
  deadline, the memory budget of image decoding);
* :mod:`~captioner.serve.connections`: uvicorn's connections under the limits it leaves out (slow and huge
  request heads, pipelining, the number of connections);
* :mod:`~captioner.serve.app`: the FastAPI application, its routes and :func:`~captioner.serve.app.serve`
  (uvicorn);
* ``static/``: the page (HTML, CSS, JavaScript; no build step, nothing fetched from elsewhere).
"""

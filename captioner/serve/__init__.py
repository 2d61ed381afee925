"""``captioner serve``: a web page and a JSON API in front of trained checkpoints.

* :mod:`~captioner.serve.checkpoints`: the checkpoints a server holds (loaded once, named by their run) and
  the batched n-best decoding of one group of images;
* :mod:`~captioner.serve.batching`: the dynamic batcher, one worker thread that has requests arriving
  together decoded as one batched beam search;
* :mod:`~captioner.serve.decoding_process`: the models in a child process of their own, which decodes each
  batch without waiting for the web server's Python;
* :mod:`~captioner.serve.schemas`: the JSON of the API (and so its OpenAPI schema);
* :mod:`~captioner.serve.errors`: every refusal as a 4xx ``{"error": "<one line>"}``, the upload size limit;
* :mod:`~captioner.serve.app`: the FastAPI application, its routes and :func:`~captioner.serve.app.serve`
  (uvicorn);
* ``static/``: the page (HTML, CSS, JavaScript; no build step, nothing fetched from elsewhere).
"""

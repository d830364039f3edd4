"""Delegates: one per vendor runtime, each a named way to turn a model file into an Engine.

``base`` defines the :class:`~edgeinfer.runtime.delegates.base.Delegate` interface (public as
``edgeinfer.Delegate``), ``registry`` finds delegates by name (built-ins and the
``edgeinfer.delegates`` entry points), and each other module is one runtime: ``xnnpack``
(LiteRT), ``coral`` (LiteRT + libedgetpu), ``onnxruntime``, ``onnxruntime_gpu``, ``openvino``,
``tensorrt``. Everything a runtime knows about its vendor (device ids, libraries, error
mapping) lives in its module. Choosing among delegates is :mod:`edgeinfer.runtime.selection`.
"""

"""Serving processor core: config, codec, engines, model lifecycle and the C ABI entry points.

This package never imports a transport framework (fastapi, grpc); front-ends live in ``server/``.
"""

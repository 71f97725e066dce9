"""One service object per task, made once per worker over its runtime (the HTTP layer's entry to the service)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.service.catalog import CatalogService
from gateway.service.classify import ClassifyService
from gateway.service.embed import EmbedService
from gateway.service.encode import EncodeService
from gateway.service.multi_vector import MultiVectorService
from gateway.service.rerank import RerankService
from gateway.service.runtime import Runtime
from gateway.service.sparse import SparseService
from gateway.service.tokens import TokenService


@dataclass(frozen=True, slots=True)
class Services:
    embed: EmbedService
    classify: ClassifyService
    rerank: RerankService
    tokens: TokenService
    sparse: SparseService
    multi_vector: MultiVectorService
    encode: EncodeService
    catalog: CatalogService

    @classmethod
    def of(cls, runtime: Runtime) -> Services:
        return cls(EmbedService(runtime), ClassifyService(runtime), RerankService(runtime), TokenService(runtime),
                   SparseService(runtime), MultiVectorService(runtime), EncodeService(runtime),
                   CatalogService(runtime))

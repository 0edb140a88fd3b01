'use strict';
/**
 * Errors from checkpointd as one class that carries the google.rpc.ErrorInfo reason, so callers
 * branch on `err.reason` ("CHECKPOINT_NOT_FOUND") instead of parsing messages.
 */

const grpc = require('@grpc/grpc-js');
const { loadContract } = require('./contract');

const STATUS_DETAILS_KEY = 'grpc-status-details-bin';
const ERROR_INFO_TYPE_URL = 'type.googleapis.com/google.rpc.ErrorInfo';
const CODE_NAMES = Object.freeze(
  Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name])),
);
/** Status codes that mean "the service could not be reached in time", not "the request is wrong". */
const UNREACHABLE_CODES = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED]);
/**
 * The ErrorInfo reason of checkpointd's RESOURCE_EXHAUSTED: its store is full, so it cannot record
 * right now. A RESOURCE_EXHAUSTED without it is gRPC's own refusal of a message over the size
 * limit: the request is wrong. The Python client classifies the same way (policy.is_unavailable).
 */
const STORAGE_EXHAUSTED = 'STORAGE_EXHAUSTED';

class CheckpointdError extends Error {
  /**
   * @param {object} fields
   * @param {number} fields.code gRPC status code (grpc.status.*).
   * @param {string} fields.details The server's message.
   * @param {string|null} fields.reason ErrorInfo.reason, e.g. "INVALID_PLAN_ID"; null without ErrorInfo.
   * @param {string|null} fields.domain ErrorInfo.domain, "checkpointd" for our errors.
   * @param {Record<string,string>} fields.metadata ErrorInfo.metadata (field, path, ids...).
   * @param {string} fields.method The RPC that failed, e.g. "CreateCheckpoint".
   * @param {Error} [fields.cause] The grpc-js error.
   */
  constructor({ code, details, reason, domain, metadata, method, cause }) {
    const codeName = CODE_NAMES[code] ?? String(code);
    super(`${method}: ${codeName}${reason ? ` ${reason}` : ''}: ${details}`, { cause });
    this.name = 'CheckpointdError';
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.reason = reason;
    this.domain = domain;
    this.metadata = metadata;
    this.method = method;
  }

  /**
   * True when the server was down, too slow or out of space (RESOURCE_EXHAUSTED with reason
   * STORAGE_EXHAUSTED): the cases core.checkpoints.on_unavailable governs.
   */
  get unreachable() {
    if (UNREACHABLE_CODES.has(this.code)) return true;
    return this.code === grpc.status.RESOURCE_EXHAUSTED && this.reason === STORAGE_EXHAUSTED;
  }
}

/** Converts a grpc-js ServiceError into a CheckpointdError, decoding the status details trailer. */
function fromServiceError(error, method) {
  if (error instanceof CheckpointdError || typeof error?.code !== 'number') return error;
  const info = decodeErrorInfo(error.metadata);
  return new CheckpointdError({
    code: error.code,
    details: error.details ?? error.message,
    reason: info?.reason || null,
    domain: info?.domain || null,
    metadata: info?.metadata ?? {},
    method,
    cause: error,
  });
}

/** The first google.rpc.ErrorInfo in the grpc-status-details-bin trailer, or null. */
function decodeErrorInfo(metadata) {
  const raw = metadata?.get(STATUS_DETAILS_KEY)?.[0];
  if (!raw) return null;
  const { Status, ErrorInfo } = loadContract().googleRpc;
  const status = Status.decode(raw);
  const any = status.details.find((detail) => (detail.type_url ?? detail.typeUrl) === ERROR_INFO_TYPE_URL);
  if (!any) return null;
  const info = ErrorInfo.toObject(ErrorInfo.decode(any.value), { defaults: true });
  return { reason: info.reason, domain: info.domain, metadata: { ...info.metadata } };
}

/** Raised by the tool runner when a checkpoint could not be taken and on_unavailable is "refuse". */
class CheckpointUnavailableError extends Error {
  constructor(message, { cause, toolName, trigger }) {
    super(message, { cause });
    this.name = 'CheckpointUnavailableError';
    this.toolName = toolName;
    this.trigger = trigger;
  }
}

module.exports = { CheckpointUnavailableError, CheckpointdError, decodeErrorInfo, fromServiceError };

//! `goodput profile export --format parquet`: one row per request, in arrival order, in
//! a Parquet file that DuckDB, Polars or Spark read directly. The schema is documented in
//! `docs/PROFILE.md` ("Parquet"); [`SCHEMA`] is the normative text.
//!
//! Written with the parquet crate's column writers (no Arrow arrays): requests are held
//! for one row group at a time ([`ROW_GROUP_ROWS`] rows, or fewer once their `hash_ids`
//! reach [`ROW_GROUP_IDS`]), then written column by column, so an export's memory is one
//! row group plus the block id map, whatever the input size. Strings are dictionary
//! encoded and pages Snappy-compressed.

use std::{io::Write, sync::Arc};

use parquet::{
    basic::Compression,
    data_type::{BoolType, ByteArray, ByteArrayType, DataType, DoubleType, Int32Type, Int64Type},
    errors::ParquetError,
    file::{
        metadata::KeyValue,
        properties::WriterProperties,
        writer::{SerializedFileWriter, SerializedRowGroupWriter},
    },
    schema::parser::parse_message_type,
};

use super::{
    read::{BlockId, Loaded, ProfileFile},
    table::BlockMap,
};

/// The Parquet schema of an export, column order included.
pub const SCHEMA: &str = "message goodput_request {
  required int64 arrival (TIMESTAMP(MILLIS,true));
  required int64 t_ms;
  required binary file (STRING);
  optional binary model (STRING);
  required binary api (STRING);
  required boolean stream;
  optional int64 input_tokens;
  optional binary input_tokens_source (STRING);
  optional int64 output_tokens;
  optional binary output_tokens_source (STRING);
  optional int64 max_tokens;
  required binary outcome (STRING);
  optional int32 status;
  required binary slo_class (STRING);
  optional boolean slo_met;
  optional double ttft_ms;
  optional double tpot_ms;
  required double e2e_ms;
  optional binary tenant (STRING);
  optional group hash_ids (LIST) {
    repeated group list {
      required int64 element;
    }
  }
}";

/// Rows per row group: DuckDB and Spark parallelize by row group, and 64 Ki rows of a
/// few hundred bytes each keep the group held in memory near 20 MB.
pub const ROW_GROUP_ROWS: usize = 65_536;
/// Block ids per row group at most (8 bytes each: 32 MB), so that long prompts, with
/// many blocks each, cannot make one group outgrow the bound above.
pub const ROW_GROUP_IDS: usize = 4 << 20;

/// Key of the key-value metadata holding the input files' headers (a JSON array, one
/// header per distinct `file` value, in order).
pub const HEADERS_KEY: &str = "goodput.headers";

/// One request waiting for its row group.
struct Row {
    at_ms: i64,
    file: usize,
    entry: super::Entry,
    hash_ids: Option<Vec<i64>>,
}

/// A Parquet export under way.
pub struct ParquetExport<W: Write + Send> {
    writer: SerializedFileWriter<W>,
    files: Vec<ByteArray>,
    first: i64,
    rows: Vec<Row>,
    ids_held: usize,
    ids: BlockMap<u64>,
    next_id: u64,
    written: usize,
    row_groups: usize,
}

impl<W: Write + Send> ParquetExport<W> {
    /// Starts a file on `out`; `first`: the earliest arrival (Unix ms), `t_ms`'s origin.
    pub fn start(out: W, files: &[ProfileFile], first: i64) -> Result<Self, ParquetError> {
        let schema = Arc::new(parse_message_type(SCHEMA)?);
        let headers: Vec<&super::Header> = files.iter().map(|f| &f.header).collect();
        let headers =
            serde_json::to_string(&headers).map_err(|e| ParquetError::External(Box::new(e)))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_created_by(format!("goodput {}", env!("CARGO_PKG_VERSION")))
            .set_key_value_metadata(Some(vec![KeyValue::new(HEADERS_KEY.to_owned(), headers)]))
            .build();
        Ok(ParquetExport {
            writer: SerializedFileWriter::new(out, schema, Arc::new(props))?,
            files: files
                .iter()
                .map(|f| ByteArray::from(f.path.display().to_string().into_bytes()))
                .collect(),
            first,
            rows: Vec::new(),
            ids_held: 0,
            ids: BlockMap::new(u64::MAX),
            next_id: 0,
            written: 0,
            row_groups: 0,
        })
    }

    /// One request, in arrival order, with its block identities. Ids are renumbered from
    /// 0 across the export in order of first appearance (as in the Mooncake export, but
    /// neither cut nor padded).
    pub fn push(&mut self, loaded: Loaded, blocks: &[BlockId]) -> Result<(), ParquetError> {
        let hash_ids = loaded.entry.hash_ids.is_some().then(|| {
            blocks
                .iter()
                .map(|b| {
                    let id = self.ids.get_or_insert_with(*b, || {
                        self.next_id += 1;
                        self.next_id - 1
                    });
                    i64::try_from(id).unwrap_or(i64::MAX)
                })
                .collect::<Vec<i64>>()
        });
        self.ids_held += hash_ids.as_ref().map_or(0, Vec::len);
        self.rows.push(Row {
            at_ms: loaded.at_ms,
            file: loaded.file,
            entry: loaded.entry,
            hash_ids,
        });
        if self.rows.len() >= ROW_GROUP_ROWS || self.ids_held >= ROW_GROUP_IDS {
            self.flush_group()?;
        }
        Ok(())
    }

    /// Writes the last row group and the footer; returns (requests, row groups) and the
    /// output.
    pub fn finish(mut self) -> Result<(usize, usize, W), ParquetError> {
        self.flush_group()?;
        let (written, groups) = (self.written, self.row_groups);
        let mut out = self.writer.into_inner()?;
        out.flush()?;
        Ok((written, groups, out))
    }

    fn flush_group(&mut self) -> Result<(), ParquetError> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(&mut self.rows);
        let mut g = self.writer.next_row_group()?;
        let first = self.first;
        let files = &self.files;
        let text = |s: &str| ByteArray::from(s.as_bytes().to_vec());
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);

        required::<Int64Type, W>(&mut g, rows.iter().map(|r| r.at_ms))?;
        required::<Int64Type, W>(&mut g, rows.iter().map(|r| r.at_ms - first))?;
        required::<ByteArrayType, W>(
            &mut g,
            rows.iter()
                .map(|r| files.get(r.file).cloned().unwrap_or_else(|| text(""))),
        )?;
        optional::<ByteArrayType, W>(
            &mut g,
            rows.iter().map(|r| r.entry.model.as_deref().map(text)),
        )?;
        required::<ByteArrayType, W>(&mut g, rows.iter().map(|r| text(&r.entry.api)))?;
        required::<BoolType, W>(&mut g, rows.iter().map(|r| r.entry.stream))?;
        optional::<Int64Type, W>(&mut g, rows.iter().map(|r| r.entry.input_tokens.map(count)))?;
        optional::<ByteArrayType, W>(
            &mut g,
            rows.iter()
                .map(|r| r.entry.input_tokens_source.as_deref().map(text)),
        )?;
        optional::<Int64Type, W>(
            &mut g,
            rows.iter().map(|r| r.entry.output_tokens.map(count)),
        )?;
        optional::<ByteArrayType, W>(
            &mut g,
            rows.iter()
                .map(|r| r.entry.output_tokens_source.as_deref().map(text)),
        )?;
        optional::<Int64Type, W>(&mut g, rows.iter().map(|r| r.entry.max_tokens.map(count)))?;
        required::<ByteArrayType, W>(&mut g, rows.iter().map(|r| text(&r.entry.outcome)))?;
        optional::<Int32Type, W>(&mut g, rows.iter().map(|r| r.entry.status.map(i32::from)))?;
        required::<ByteArrayType, W>(&mut g, rows.iter().map(|r| text(&r.entry.slo_class)))?;
        optional::<BoolType, W>(&mut g, rows.iter().map(|r| r.entry.slo_met))?;
        optional::<DoubleType, W>(&mut g, rows.iter().map(|r| r.entry.ttft_ms))?;
        optional::<DoubleType, W>(&mut g, rows.iter().map(|r| r.entry.tpot_ms))?;
        required::<DoubleType, W>(&mut g, rows.iter().map(|r| r.entry.e2e_ms))?;
        optional::<ByteArrayType, W>(
            &mut g,
            rows.iter().map(|r| r.entry.tenant.as_deref().map(text)),
        )?;
        list_of_i64(&mut g, rows.iter().map(|r| r.hash_ids.as_deref()))?;
        g.close()?;

        self.written += rows.len();
        self.row_groups += 1;
        self.ids_held = 0;
        Ok(())
    }
}

/// The next column of `g`, which the schema says is of type `T`.
fn next<'a, W: Write + Send>(
    g: &'a mut SerializedRowGroupWriter<'_, W>,
) -> Result<parquet::file::writer::SerializedColumnWriter<'a>, ParquetError> {
    g.next_column()?
        .ok_or_else(|| ParquetError::General("more values than schema columns".into()))
}

/// A required column: every row has a value.
fn required<T: DataType, W: Write + Send>(
    g: &mut SerializedRowGroupWriter<'_, W>,
    values: impl Iterator<Item = T::T>,
) -> Result<(), ParquetError> {
    let values: Vec<T::T> = values.collect();
    let mut c = next(g)?;
    c.typed::<T>().write_batch(&values, None, None)?;
    c.close()
}

/// An optional column: definition level 1 where there is a value, 0 for null.
fn optional<T: DataType, W: Write + Send>(
    g: &mut SerializedRowGroupWriter<'_, W>,
    values: impl Iterator<Item = Option<T::T>>,
) -> Result<(), ParquetError> {
    let mut present = Vec::new();
    let mut def = Vec::new();
    for v in values {
        def.push(i16::from(v.is_some()));
        present.extend(v);
    }
    let mut c = next(g)?;
    c.typed::<T>().write_batch(&present, Some(&def), None)?;
    c.close()
}

/// An optional list of required int64: definition level 0 for a null list, 1 for an
/// empty one, 2 for an element; repetition level 1 for every element after a list's
/// first.
fn list_of_i64<'l, W: Write + Send>(
    g: &mut SerializedRowGroupWriter<'_, W>,
    lists: impl Iterator<Item = Option<&'l [i64]>>,
) -> Result<(), ParquetError> {
    let (mut values, mut def, mut rep) = (Vec::new(), Vec::new(), Vec::new());
    for list in lists {
        match list {
            None => {
                def.push(0);
                rep.push(0);
            }
            Some([]) => {
                def.push(1);
                rep.push(0);
            }
            Some(ids) => {
                for (i, id) in ids.iter().enumerate() {
                    values.push(*id);
                    def.push(2);
                    rep.push(i16::from(i > 0));
                }
            }
        }
    }
    let mut c = next(g)?;
    c.typed::<Int64Type>()
        .write_batch(&values, Some(&def), Some(&rep))?;
    c.close()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{
        ExportFormat, Profile, Sorted, export, export_sorted, sorted::tests::finish_ordered_files,
    };
    use parquet::{
        file::reader::{FileReader, SerializedFileReader},
        record::{Field, RowAccessor},
    };
    use std::collections::HashMap;

    /// Every row of `bytes`, as the parquet crate's reader gives it.
    fn read_back(
        bytes: Vec<u8>,
    ) -> (
        SerializedFileReader<bytes::Bytes>,
        Vec<parquet::record::Row>,
    ) {
        let reader = SerializedFileReader::new(bytes::Bytes::from(bytes)).unwrap();
        let rows = reader
            .get_row_iter(None)
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        let reader = reader;
        (reader, rows)
    }

    fn list(row: &parquet::record::Row, i: usize) -> Option<Vec<i64>> {
        match &row.get_column_iter().nth(i).unwrap().1 {
            Field::Null => None,
            Field::ListInternal(l) => Some(
                l.elements()
                    .iter()
                    .map(|f| match f {
                        Field::Long(v) => *v,
                        other => panic!("{other:?}"),
                    })
                    .collect(),
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_request_reads_back_as_recorded_in_arrival_order() {
        let (dir, paths) = finish_ordered_files("parquet");
        let profile = Profile::read(&paths).unwrap();
        let mut out = Vec::new();
        let stats = export(&profile, ExportFormat::Parquet, &mut out).unwrap();
        assert_eq!(stats.written, profile.entries.len());
        assert_eq!(stats.skipped, 0);
        let (reader, rows) = read_back(out.clone());
        assert_eq!(rows.len(), profile.entries.len());

        let meta = reader.metadata().file_metadata();
        let names: Vec<&str> = meta
            .schema_descr()
            .columns()
            .iter()
            .map(|c| c.path().parts()[0].as_str())
            .collect();
        assert_eq!(names.first(), Some(&"arrival"));
        assert_eq!(names.last(), Some(&"hash_ids"));
        let headers = meta
            .key_value_metadata()
            .unwrap()
            .iter()
            .find(|kv| kv.key == HEADERS_KEY)
            .and_then(|kv| kv.value.clone())
            .unwrap();
        let headers: Vec<serde_json::Value> = serde_json::from_str(&headers).unwrap();
        assert_eq!(headers.len(), 3);
        assert_eq!(headers[0]["format"], "goodput-profile");

        let first = profile.entries[0].at_ms;
        let mut ids: HashMap<BlockId, i64> = HashMap::new();
        for ((l, blocks), row) in profile
            .entries
            .iter()
            .zip(profile.block_identities())
            .zip(&rows)
        {
            let e = &l.entry;
            assert_eq!(row.get_timestamp_millis(0).unwrap(), l.at_ms);
            assert_eq!(row.get_long(1).unwrap(), l.at_ms - first);
            assert_eq!(
                row.get_string(2).unwrap(),
                &profile.files[l.file].path.display().to_string()
            );
            assert_eq!(row.get_string(3).ok(), e.model.as_ref());
            assert_eq!(row.get_string(4).unwrap(), &e.api);
            assert_eq!(row.get_bool(5).unwrap(), e.stream);
            assert_eq!(row.get_long(6).ok(), e.input_tokens.map(|n| n as i64));
            assert_eq!(row.get_string(7).ok(), e.input_tokens_source.as_ref());
            assert_eq!(row.get_long(8).ok(), e.output_tokens.map(|n| n as i64));
            assert_eq!(row.get_long(10).ok(), e.max_tokens.map(|n| n as i64));
            assert_eq!(row.get_string(11).unwrap(), &e.outcome);
            assert_eq!(row.get_int(12).ok(), e.status.map(i32::from));
            assert_eq!(row.get_string(13).unwrap(), &e.slo_class);
            assert_eq!(row.get_bool(14).ok(), e.slo_met);
            assert_eq!(row.get_double(15).ok(), e.ttft_ms);
            assert_eq!(row.get_double(16).ok(), e.tpot_ms);
            assert_eq!(row.get_double(17).unwrap(), e.e2e_ms);
            assert_eq!(row.get_string(18).ok(), e.tenant.as_ref());
            // Ids in order of first appearance, equal blocks equal ids (one salt here).
            let n = ids.len() as i64;
            let want: Vec<i64> = blocks
                .iter()
                .scan(n, |next, b| {
                    Some(*ids.entry(*b).or_insert_with(|| {
                        *next += 1;
                        *next - 1
                    }))
                })
                .collect();
            assert_eq!(list(row, 19), e.hash_ids.as_ref().map(|_| want));
        }
        // Block 0 is every request's first block, in every file: one id across files.
        assert!(rows.iter().all(|r| list(r, 19).unwrap()[0] == 0));

        // The streamed export writes the same bytes.
        let sorted = Sorted::read_in_runs(&paths, 4096).unwrap();
        let mut streamed = Vec::new();
        let got = export_sorted(&sorted, ExportFormat::Parquet, &mut streamed).unwrap();
        assert_eq!(got, stats);
        assert!(streamed == out);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn loaded(i: i64, entry: &super::super::Entry) -> Loaded {
        Loaded {
            file: 0,
            at_ms: 1_000 + i,
            entry: entry.clone(),
        }
    }

    #[test]
    fn nulls_empty_lists_and_row_groups() {
        let line = r#"{"t_ms":0,"api":"completions","stream":false,"outcome":"client_error","e2e_ms":1.5}"#;
        let bare: super::super::Entry = serde_json::from_str(line).unwrap();
        let mut empty = bare.clone();
        empty.hash_ids = Some(Vec::new());
        empty.status = Some(499);
        empty.tenant = Some("ab12".into());
        let file = ProfileFile {
            path: "a.jsonl".into(),
            header: super::super::Header::new(
                super::super::from_unix_ms(1_000),
                "s",
                super::super::Block {
                    unit: super::super::BlockUnit::Bytes,
                    size: 2048,
                },
                &Default::default(),
            ),
            start_ms: 1_000,
            report: Default::default(),
            keys: crate::profile::table::IdTable::new(u64::MAX),
        };
        let n = ROW_GROUP_ROWS + 3;
        let mut x = ParquetExport::start(Vec::new(), &[file], 1_000).unwrap();
        for i in 0..n {
            let e = if i % 2 == 0 { &bare } else { &empty };
            x.push(loaded(i as i64, e), &[]).unwrap();
        }
        let (written, groups, out) = x.finish().unwrap();
        assert_eq!((written, groups), (n, 2));
        let (reader, rows) = read_back(out);
        assert_eq!(reader.metadata().num_row_groups(), 2);
        assert_eq!(
            reader.metadata().row_group(0).num_rows(),
            ROW_GROUP_ROWS as i64
        );
        assert_eq!(rows.len(), n);
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row.get_long(1).unwrap(), i as i64);
            assert!(row.get_string(3).is_err(), "model is null");
            assert!(row.get_long(6).is_err(), "input_tokens is null");
            assert!(row.get_bool(14).is_err(), "slo_met is null");
            if i % 2 == 0 {
                assert_eq!(list(row, 19), None);
                assert!(row.get_int(12).is_err());
            } else {
                assert_eq!(list(row, 19), Some(Vec::new()));
                assert_eq!(row.get_int(12).unwrap(), 499);
                assert_eq!(row.get_string(18).unwrap(), "ab12");
            }
        }
    }

    #[test]
    fn long_prompts_close_a_group_early() {
        let mut e: super::super::Entry = serde_json::from_str(
            r#"{"t_ms":0,"api":"chat_completions","stream":true,"outcome":"ok","e2e_ms":1}"#,
        )
        .unwrap();
        let per_row = ROW_GROUP_IDS / 4;
        e.hash_ids = Some((0..per_row as u32).collect());
        let blocks: Vec<BlockId> = (0..per_row as u32).map(|i| BlockId::Local(0, i)).collect();
        let mut x = ParquetExport::start(Vec::new(), &[], 0).unwrap();
        for i in 0..5 {
            x.push(loaded(i, &e), &blocks).unwrap();
        }
        let (written, groups, _) = x.finish().unwrap();
        assert_eq!((written, groups), (5, 2));
    }

    #[test]
    fn the_documented_schema_is_the_written_one() {
        let doc = include_str!("../../docs/PROFILE.md");
        assert!(
            doc.contains(SCHEMA),
            "docs/PROFILE.md must quote columnar::SCHEMA"
        );
    }

    #[test]
    fn a_failing_output_is_an_error() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    "disk full",
                ))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let err = ParquetExport::start(Full, &[], 0)
            .and_then(|x| x.finish())
            .err()
            .unwrap();
        assert!(err.to_string().contains("disk full"), "{err}");
    }
}
